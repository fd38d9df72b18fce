package guarded

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// unsettled remembers the keys of inserts whose outcome is unknown (an
// error that [NotWritten] cannot prove harmless, ErrMaybeWritten, a
// cancelled context, a panic), so that rebuilds keep them until the store
// settles them. An insert that returned has, as far as a rebuild can
// tell, either committed or not; one whose outcome is unknown may commit
// later, after a rebuild has read the store's keys without it, and the
// guard that rebuild swaps in would then miss a committed row.
//
// A key is settled, and forgotten, when the store shows its row: the read
// of a rebuild from the key source that began after the write returned
// contains it, a later Insert of it succeeds, or a Delete of it finds the
// row. (The last two hold for a unique key, whose second insert cannot
// commit while the first is undecided: it waits for it, and fails if the
// first commits. They settle only the records made before their own write
// began: a Delete that found the row of an earlier insert says nothing of
// an insert of the key that began after the row was gone, and recorded an
// unknown outcome before the Delete returned.) A feed's Resync settles
// nothing: the stream's read may have begun before the write. A key whose row never shows (the write did
// not commit after all) is forgotten once the settle time has passed
// since its write returned: by then a write that committed is visible.
// Each rebuild adds every key it still remembers to its fresh guard, one
// copy, whatever its read finds.
//
// The set holds at most max keys (about 50 bytes each). An unknown
// outcome that does not fit is not remembered; instead every rebuild
// whose read begins within the settle time of it swaps in a guard that
// passes every lookup through (correct, and as slow as no guard), and the
// first lookup or insert after that time asks for a rebuild that filters
// again.
//
// Until the store settles a key, its row may show up with no write of the
// Loader's to mark it: lookups of the key neither trust nor leave a
// negative-cache entry, nor a store call shared with a lookup that began
// before them (see Loader.settle).
//
// Keys are kept as their hashes under the guard's seed, which rebuilds
// keep; a feed's Replace with a guard of another seed turns the keys it
// remembers into such a pass-through window.
type unsettled struct {
	max    int
	settle time.Duration

	// mu orders the writers (records, settlements, purges); lookups read
	// keys without it.
	mu      sync.Mutex
	keys    *xsync.MapOf[uint64, unsettledKey] // by key hash
	seq     atomic.Uint64                      // records so far; written under mu
	purgeAt int64                              // under mu: no entry of a full keys expires before then
	n       atomic.Int64                       // keys.Size(), written under mu
	// until is the unix nanoseconds before which a rebuild may lack a
	// key whose outcome is unknown and that keys did not take.
	until     atomic.Int64
	overflows atomic.Uint64 // unknown outcomes keys had no room for
}

// unsettledKey is what unsettled remembers of a key.
type unsettledKey struct {
	until int64  // unix nanoseconds until which it is kept
	seq   uint64 // the record's number: a read that began after it can settle it
}

func newUnsettled(max int, settle time.Duration) *unsettled {
	return &unsettled{max: max, settle: settle, keys: xsync.NewMapOf[uint64, unsettledKey]()}
}

// record remembers the key with hash h, whose write's outcome is unknown
// at now.
func (u *unsettled) record(h uint64, now int64) {
	expires := now + int64(u.settle)
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.keys.Load(h); !ok && int(u.n.Load()) >= u.max {
		if now >= u.purgeAt {
			u.purgeLocked(now)
		}
		if int(u.n.Load()) >= u.max {
			u.overflows.Add(1)
			u.passUntil(expires)
			return
		}
	}
	seq := u.seq.Add(1)
	u.keys.Store(h, unsettledKey{until: expires, seq: seq})
	u.n.Store(int64(u.keys.Size()))
}

// purgeLocked forgets the keys whose settle time has passed, and notes
// when the next of those left expires. The caller holds mu.
func (u *unsettled) purgeLocked(now int64) {
	next := int64(1<<63 - 1)
	u.keys.Range(func(h uint64, k unsettledKey) bool {
		if k.until <= now {
			u.keys.Delete(h)
		} else {
			next = min(next, k.until)
		}
		return true
	})
	u.purgeAt = next
	u.n.Store(int64(u.keys.Size()))
}

// mark returns the number of the last record, for a write about to run:
// if the write shows the key's row, settledBefore(h, mark) forgets the
// records of the key made before it began, and no later one.
func (u *unsettled) mark() uint64 { return u.seq.Load() }

// settledBefore forgets the key with hash h if its record is numbered
// seq or lower: a write that began after that record (mark) showed the
// key's row, so the insert it records was decided by then.
func (u *unsettled) settledBefore(h, seq uint64) {
	u.readSettles(h, seq, nil)
}

// readSettles forgets the key with hash h, found by a read of the store's
// keys that began after the record numbered seq (a record after seq may
// be of a write that the read came too early for), and reports whether it
// did. It calls before, if not nil, first: lookups that find the key
// settled must not join a store call that began before the row showed.
func (u *unsettled) readSettles(h, seq uint64, before func()) bool {
	if u.n.Load() == 0 {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	k, ok := u.keys.Load(h)
	if !ok || k.seq > seq {
		return false
	}
	if before != nil {
		before()
	}
	u.keys.Delete(h)
	u.n.Store(int64(u.keys.Size()))
	return true
}

// pending returns the hashes of the keys a rebuild whose read begins at
// now must add to its guard, the number of the last record (see
// readSettles), and whether the rebuild must pass every lookup through
// until the returned time, for keys it could not remember.
func (u *unsettled) pending(now int64) (keys []uint64, seq uint64, passUntil int64) {
	if until := u.until.Load(); now < until {
		passUntil = until
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	seq = u.seq.Load()
	if u.n.Load() == 0 {
		return nil, seq, passUntil
	}
	u.purgeLocked(now)
	keys = make([]uint64, 0, u.n.Load())
	u.keys.Range(func(h uint64, _ unsettledKey) bool {
		keys = append(keys, h)
		return true
	})
	return keys, seq, passUntil
}

// rehash ends what the keys' hashes can say, for a guard of another seed:
// the keys are forgotten, and the pass-through window covers them until
// they would have expired.
func (u *unsettled) rehash(now int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	last := int64(0)
	u.keys.Range(func(_ uint64, k unsettledKey) bool {
		last = max(last, k.until)
		return true
	})
	u.keys.Clear()
	u.n.Store(0)
	if last > now {
		u.passUntil(last)
	}
}

// passUntil moves the end of the pass-through window (until) to t, if
// that is later.
func (u *unsettled) passUntil(t int64) {
	for {
		old := u.until.Load()
		if old >= t || u.until.CompareAndSwap(old, t) {
			return
		}
	}
}

// mayShow reports whether a row of the key with hash h may show up in
// the store with no write of the Loader's to mark it: an insert of it has
// an unknown outcome (remembered; one past its settle time but not yet
// purged counts too), or an unknown outcome that did not fit may still
// show (now is called only then). It takes no lock.
func (u *unsettled) mayShow(h uint64, now func() time.Time) bool {
	if u.n.Load() != 0 {
		if _, ok := u.keys.Load(h); ok {
			return true
		}
	}
	return u.until.Load() != 0 && now().UnixNano() < u.until.Load()
}

// len returns the number of keys remembered.
func (u *unsettled) len() int { return int(u.n.Load()) }
