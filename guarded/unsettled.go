package guarded

import (
	"sync"
	"sync/atomic"
	"time"
)

// unsettled remembers the keys of inserts whose outcome is unknown (an
// error that [NotWritten] cannot prove harmless, ErrMaybeWritten, a
// cancelled context, a panic), so that rebuilds keep them until the store
// settles them. An insert that returned has, as far as a rebuild can
// tell, either committed or not; one whose outcome is unknown may commit
// later, after a rebuild has read the store's keys without it, and the
// guard that rebuild swaps in would then miss a committed row.
//
// A key is settled, and forgotten, when the store shows its row: a
// rebuild's read of the keys (or a feed's Resync) contains it, a later
// Insert of it succeeds, or a Delete of it finds the row. A key whose row
// never shows (the write did not commit after all) is forgotten once the
// settle time has passed since its write returned: by then a write that
// committed is visible. Each rebuild adds every key it still remembers to
// its fresh guard, one copy, whatever its read finds.
//
// The set holds at most max keys (about 50 bytes each). An unknown
// outcome that does not fit is not remembered; instead every rebuild
// whose read begins within the settle time of it swaps in a guard that
// passes every lookup through (correct, and as slow as no guard), and the
// first lookup or insert after that time asks for a rebuild that filters
// again.
//
// Keys are kept as their hashes under the guard's seed, which rebuilds
// keep; a feed's Replace with a guard of another seed turns the keys it
// remembers into such a pass-through window.
type unsettled struct {
	max    int
	settle time.Duration

	mu      sync.Mutex
	keys    map[uint64]int64 // key hash → unix nanoseconds until which it is kept; under mu
	purgeAt int64            // under mu: no entry of a full keys expires before then
	n       atomic.Int64     // len(keys), read without mu
	// until is the unix nanoseconds before which a rebuild may lack a
	// key whose outcome is unknown and that keys did not take.
	until     atomic.Int64
	overflows atomic.Uint64 // unknown outcomes keys had no room for
}

func newUnsettled(max int, settle time.Duration) *unsettled {
	return &unsettled{max: max, settle: settle, keys: make(map[uint64]int64)}
}

// record remembers the key with hash h, whose write's outcome is unknown
// at now.
func (u *unsettled) record(h uint64, now int64) {
	expires := now + int64(u.settle)
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.keys[h]; !ok && len(u.keys) >= u.max {
		if now >= u.purgeAt {
			u.purgeLocked(now)
		}
		if len(u.keys) >= u.max {
			u.overflows.Add(1)
			for {
				old := u.until.Load()
				if old >= expires || u.until.CompareAndSwap(old, expires) {
					return
				}
			}
		}
	}
	u.keys[h] = expires
	u.n.Store(int64(len(u.keys)))
}

// purgeLocked forgets the keys whose settle time has passed, and notes
// when the next of those left expires. The caller holds mu.
func (u *unsettled) purgeLocked(now int64) {
	next := int64(1<<63 - 1)
	for h, until := range u.keys {
		if until <= now {
			delete(u.keys, h)
		} else {
			next = min(next, until)
		}
	}
	u.purgeAt = next
	u.n.Store(int64(len(u.keys)))
}

// settled forgets the key with hash h: the store showed its row.
func (u *unsettled) settled(h uint64) {
	if u.n.Load() == 0 {
		return
	}
	u.mu.Lock()
	delete(u.keys, h)
	u.n.Store(int64(len(u.keys)))
	u.mu.Unlock()
}

// pending returns the hashes of the keys a rebuild whose read begins at
// now must add to its guard, and whether it must pass every lookup
// through until the returned time, for keys it could not remember.
func (u *unsettled) pending(now int64) (keys []uint64, passUntil int64) {
	if until := u.until.Load(); now < until {
		passUntil = until
	}
	if u.n.Load() == 0 {
		return nil, passUntil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.purgeLocked(now)
	keys = make([]uint64, 0, len(u.keys))
	for h := range u.keys {
		keys = append(keys, h)
	}
	return keys, passUntil
}

// rehash ends what the keys' hashes can say, for a guard of another seed:
// the keys are forgotten, and the pass-through window covers them until
// they would have expired.
func (u *unsettled) rehash(now int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	last := int64(0)
	for _, until := range u.keys {
		last = max(last, until)
	}
	clear(u.keys)
	u.n.Store(0)
	for last > now {
		old := u.until.Load()
		if old >= last || u.until.CompareAndSwap(old, last) {
			return
		}
	}
}

// len returns the number of keys remembered.
func (u *unsettled) len() int { return int(u.n.Load()) }
