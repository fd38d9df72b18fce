package guarded

import (
	"context"
	"errors"
	"sync"
)

// Change is one write to the store, for [Loader.CatchUp] and
// [Loader.Apply].
type Change[K comparable] struct {
	Key     K
	Deleted bool // the row was deleted; else it was created
}

// feedHook is what AttachFeed keeps of a change feed.
type feedHook struct {
	resync func() // asks the feed to rebuild the guard from a snapshot
}

// AttachFeed declares that a change feed keeps this Loader in step with
// the store, until the returned detach is called. While it is attached:
//
//   - [Loader.Delete] does not remove keys from the guard. The feed
//     reports every committed delete, this process's own included, to
//     [Loader.Apply] in commit order, so each removal follows the creation
//     it undoes. (A Delete that removed its key itself could run before
//     this process learned of the row's creation, say by another replica,
//     and take another key's copy.) The feed still skips this process's
//     own inserts, which [Loader.Insert] added.
//   - A rebuild the Loader needs (a shard that cannot take a key, or the
//     false-positive rate above [WithMaxFPR]) is asked of the feed by
//     calling resync, at most once every 10 seconds; resync must not
//     block. The feed then rebuilds through [Loader.Resync] from a read
//     whose snapshot it can order against its changes. The store's key
//     list ([KeyLister]) is not used.
//
// AttachFeed invalidates the Loader, which passes every lookup through
// until the feed has resynced and calls [Loader.MarkReady], and waits for
// the Deletes in flight, so that none removes a key after it returns.
// detach invalidates the Loader too: without the feed it cannot know what
// the guard lacks. A Loader has at most one feed at a time: AttachFeed
// returns an error while another is attached.
func (l *Loader[K, V]) AttachFeed(resync func()) (detach func(), err error) {
	if resync == nil {
		return nil, errors.New("guarded: AttachFeed needs a resync function")
	}
	h := &feedHook{resync: resync}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if !l.feed.CompareAndSwap(nil, h) {
		return nil, errors.New("guarded: the Loader has a change feed already")
	}
	l.Invalidate()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.writeMu.Lock()
			defer l.writeMu.Unlock()
			l.Invalidate()
			l.feed.CompareAndSwap(h, nil)
		})
	}, nil
}

// errNoFeed is returned by Apply without AttachFeed.
var errNoFeed = errors.New("guarded: Apply needs a change feed: call AttachFeed first")

// Apply applies one committed write to the store, reported by the change
// feed attached with [Loader.AttachFeed]: a created key is added to the
// guard (and to a guard being rebuilt), a deleted one removed. Report each
// committed write once, in commit order: every delete, this process's own
// included, and the creations made by other processes (this process's own
// were added by [Loader.Insert]). Call Apply and [Loader.Resync] from one
// goroutine, the feed's.
func (l *Loader[K, V]) Apply(c Change[K]) error {
	if l.feed.Load() == nil {
		return errNoFeed
	}
	if c.Deleted {
		l.writeMu.RLock()
		defer l.writeMu.RUnlock()
		cur := l.cur.Load()
		h := l.codec.hash(cur.g, c.Key)
		l.flight.forget(h, c.Key)
		cur.g.RemoveHash(h)
		return nil
	}
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	cur, sh := l.cur.Load(), l.shadow.Load()
	h := l.codec.hash(cur.g, c.Key)
	l.epoch(h).Add(1) // voids negative-cache entries of the key
	if _, err := l.add(cur, h); err != nil {
		return wrap("apply", err)
	}
	if sh != nil {
		l.add(sh, h) // a failed rebuild closes sh: nothing to keep
	}
	// As in Insert: later lookups must not join a store call that began
	// before the row existed, nor trust what such a call cached.
	l.flight.forget(h, c.Key)
	l.epoch(h).Add(1)
	return nil
}

// Resync builds a fresh guard while the Loader passes every lookup
// through and swaps it in; the Loader stays invalid until the caller has
// applied the changes the fill did not see and calls [Loader.MarkReady].
// fill gets functions that add keys to and remove keys from the fresh
// guard; inserts made through this Loader meanwhile reach it too. A change
// feed uses it to start over after an interruption: read every key, then
// the changes the read did not see.
func (l *Loader[K, V]) Resync(ctx context.Context, fill func(ctx context.Context, add func(K) error, remove func(K)) error) error {
	switch {
	case ctx == nil:
		return errNil("Resync", "ctx")
	case fill == nil:
		return errNil("Resync", "fill")
	}
	l.Invalidate()
	err := l.replace(ctx, func(ctx context.Context, nv *view) (int64, error) {
		var n int64
		add := func(k K) error {
			n++
			_, err := l.add(nv, l.codec.hash(nv.g, k))
			return err
		}
		remove := func(k K) { nv.g.RemoveHash(l.codec.hash(nv.g, k)) }
		err := fill(ctx, add, remove)
		return n, err
	})
	if err != nil {
		return wrap("resync", err)
	}
	return nil
}
