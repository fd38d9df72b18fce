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
			continue
		}
		if err := a.apply(k, false); err != nil {
			return err
		}
	}
	for _, text := range tt.deletes {
		k, err := a.key(text)
		if err != nil {
			return err
		}
		if err := a.apply(k, true); err != nil {
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

// spill applies the creations of a transaction too big to hold back (see
// maxTxKeys), before its commit and its tags: none is skipped.
func (a *applier[K]) spill(_ int, creates []string) error {
	for _, text := range creates {
		k, err := a.key(text)
		if err != nil {
			return err
		}
		if err := a.apply(k, false); err != nil {
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
