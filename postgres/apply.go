package postgres

import (
	"fmt"
	"time"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// applier applies what a session's decoder decodes to the Follower's
// Loader: it is the decoder's txnSink.
type applier[K comparable] struct {
	f   *Follower[K]
	s   *session
	now time.Time // when the message being applied arrived

	// released is the heartbeat whose snapshot release last checked the
	// held deletions against: each later commit checks only its own.
	released *walsender
}

// heldDeletes are the deletions of one committed transaction that is not
// known to be visible yet (Follower.held).
//
// Deletions wait until their transaction is visible (release): a
// transaction is decoded as soon as its commit record is flushed, and
// becomes visible to other sessions only when its backend leaves the
// running transactions (under synchronous replication, once the standbys
// answered). Removed before that, a key would read absent while every
// query still finds its row. Creations are applied at once: early, a key
// is a false positive, never a false negative.
type heldDeletes[K comparable] struct {
	xid  uint32
	keys []K
}

// commit applies one committed transaction: its creations, less the keys
// that this run's tags name (the Loader added those before writing them),
// each skipped once; then its deletions; then it moves the position past
// it. A transaction that truncated the table, or deleted more keys than
// were held back, ends the session after it: only a full read can drop
// the keys that are gone.
func (a *applier[K]) commit(t *txn) error {
	f := a.f
	tt := &t.tables[0]
	own := f.tags.Own(t.tags)
	for _, text := range tt.creates {
		k, err := a.key(text)
		if err != nil {
			return err
		}
		if own[k] > 0 {
			own[k]--
			f.skipped.Add(1)
			if f.cancelHeld(k) {
				// The Loader added this creation's copy; the held
				// deletion it cancels takes one copy now.
				if err := a.apply(k, true); err != nil {
					return err
				}
			}
			continue
		}
		if err := a.create(k); err != nil {
			return err
		}
	}
	if len(tt.deletes) > 0 {
		p := heldDeletes[K]{xid: t.xid, keys: make([]K, 0, len(tt.deletes))}
		for _, text := range tt.deletes {
			k, err := a.key(text)
			if err != nil {
				return err
			}
			p.keys = append(p.keys, k)
			if f.heldKeys == nil {
				f.heldKeys, f.cancelled = map[K]int{}, map[K]int{}
			}
			f.heldKeys[k]++
		}
		f.held = append(f.held, p)
		if err := a.releaseLast(); err != nil {
			return err
		}
	}
	f.setApplied(t.end)
	switch {
	case tt.truncated:
		return errTruncated
	case t.overflow:
		return errBigTransaction
	}
	return nil
}

// release applies the held deletions whose transactions the last
// heartbeat's snapshot found visible (each heartbeat's statement reads
// its snapshot), once per heartbeat: a deletion waits for a heartbeat
// that ran after its transaction became visible, a heartbeat interval or
// so. (Checked on every pass of the session's loop, the ~300 deletions
// held under TestTupleKeysMultiTenant's writers made the loop too slow
// under -race for its heartbeats to come back in time.) Deletions
// commute with one another, and each pairs with a creation applied
// before it: they may be released in any order. The held deletions
// outlive a session (the next resumes past them, and its heartbeats
// release them); a full read or a restore from the snapshot file
// replaces the guard and drops them.
func (a *applier[K]) release() error {
	f := a.f
	if len(f.held) == 0 || a.s.walsender == nil {
		return nil
	}
	w := a.s.walsender.Load()
	if w == nil || w == a.released {
		return nil
	}
	a.released = w
	kept := f.held[:0]
	for _, p := range f.held {
		if !w.snap.VisibleXid(p.xid) {
			kept = append(kept, p)
			continue
		}
		if err := a.applyHeld(p); err != nil {
			return err
		}
	}
	clear(f.held[len(kept):])
	f.held = kept
	return nil
}

// spill applies the creations of a transaction too big to hold back (see
// maxTxKeys), before its commit and its tags: none is skipped.
func (a *applier[K]) spill(_ int, creates []string) error {
	for _, text := range creates {
		k, err := a.key(text)
		if err != nil {
			return err
		}
		if err := a.create(k); err != nil {
			return err
		}
	}
	return nil
}

// control handles a marker or a heartbeat: this follower's own, whose
// prefix is controlPrefix alone (the others' are relayed ones).
func (a *applier[K]) control(prefix, payload string) error {
	if prefix != controlPrefix {
		return nil
	}
	// Before a heartbeat back says that every change committed before it
	// was sent is applied (CurrentAsOf, the lease): the deletions visible
	// to its snapshot, or a later one's, are.
	if err := a.release(); err != nil {
		return err
	}
	_, err := a.f.control(a.s, payload, a.now)
	return err
}

func (a *applier[K]) key(text string) (K, error) {
	k, err := a.f.parse(text)
	if err != nil {
		return k, failed(ReasonNotification, fmt.Errorf("postgres: follower: parse key %q: %w", text, err))
	}
	return k, nil
}

// apply applies the creation of k or, if deleted, its deletion.
func (a *applier[K]) apply(k K, deleted bool) error {
	if err := a.f.feed.Apply(guarded.Change[K]{Key: k, Deleted: deleted}); err != nil {
		return failed(ReasonNotification, err)
	}
	a.f.applied.Add(1)
	a.f.lastApplied.Store(a.now.UnixNano())
	return nil
}

// releaseLast applies the deletions just held if the heartbeat that
// release last checked against already sees their transaction.
func (a *applier[K]) releaseLast() error {
	f := a.f
	if a.released == nil || !a.released.snap.VisibleXid(f.held[len(f.held)-1].xid) {
		return nil
	}
	if err := a.applyHeld(f.held[len(f.held)-1]); err != nil {
		return err
	}
	f.held[len(f.held)-1] = heldDeletes[K]{}
	f.held = f.held[:len(f.held)-1]
	return nil
}

// create applies the creation of k: it cancels a held deletion of k if
// there is one, and adds a copy otherwise. A key deleted and created
// again within a heartbeat would otherwise gather copies, one per
// creation, while its deletions wait; past guard.MaxCopies the guard
// takes no more (a unique key never needs them), and the held deletions,
// applied later, would then take the last copy of a live key. Cancelling
// is safe because a unique key's creation commits only after the
// transaction that deleted it is visible (the insert waits for it in the
// index), so the deletion it cancels was due anyway.
func (a *applier[K]) create(k K) error {
	if a.f.cancelHeld(k) {
		a.f.applied.Add(1)
		a.f.lastApplied.Store(a.now.UnixNano())
		return nil
	}
	return a.apply(k, false)
}

// cancelHeld cancels one held deletion of k, if there is one: the next
// held deletion of k that is released removes nothing.
func (f *Follower[K]) cancelHeld(k K) bool {
	if f.heldKeys[k] == 0 {
		return false
	}
	if f.heldKeys[k]--; f.heldKeys[k] == 0 {
		delete(f.heldKeys, k)
	}
	f.cancelled[k]++
	return true
}

// applyHeld applies the held deletions of p, less those cancelled.
func (a *applier[K]) applyHeld(p heldDeletes[K]) error {
	f := a.f
	for _, k := range p.keys {
		if f.cancelled[k] > 0 {
			if f.cancelled[k]--; f.cancelled[k] == 0 {
				delete(f.cancelled, k)
			}
			continue
		}
		if f.heldKeys[k]--; f.heldKeys[k] <= 0 {
			delete(f.heldKeys, k)
		}
		if err := a.apply(k, true); err != nil {
			return err
		}
	}
	return nil
}

// dropHeld forgets the held deletions, when the guard is replaced: by a
// full read, which sees each one that is visible (the others come again
// in the stream, past the read's snapshot), or by the snapshot file's
// guard, which keeps their keys as false positives until the next read.
func (f *Follower[K]) dropHeld() {
	clear(f.held)
	f.held = f.held[:0]
	clear(f.heldKeys)
	clear(f.cancelled)
}
