package guarded

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/cuckooguard/cuckooguard/guard"
)

// Change is one write to the store, for [Loader.CatchUp] and
// [Feed.Apply].
type Change[K comparable] struct {
	Key     K
	Deleted bool // the row was deleted; else it was created
}

// Feed is a change stream's handle on a Loader: the writes of every
// process to the store, in commit order (the postgres package's Follower
// is one; a CDC pipeline or a message queue can be another). [Loader.AttachFeed]
// returns it. The stream reads the store's keys into a fresh guard with
// [Feed.Resync] (or installs a guard it saved with [Feed.Replace]),
// applies each committed write after that read with [Feed.Apply], and
// calls [Feed.MarkReady] once the guard has caught up; until then, and
// after [Feed.Invalidate], the Loader passes every lookup through. When
// the Loader needs a fresh guard (a shard that cannot take a key, or an
// estimated false-positive rate above [WithMaxFPR]) it asks on
// [Feed.Requests], at most once every 10 seconds, and the stream answers
// with a Resync when it can order one against its changes.
//
// While a Feed is attached, [Loader.Delete] removes nothing from the guard:
// the stream applies every committed delete, this process's own included,
// in commit order, so that each removal follows the creation it undoes. (A
// Delete that removed its key itself could run before this process learned
// of the row's creation, say by another process, and take another key's
// copy.) The stream skips only this process's own inserts, which
// [Loader.Insert] added before writing them.
//
// Call Apply, Resync, Replace, MarkReady and Invalidate from one goroutine,
// the stream's; Requests and Guard may be used from any. After
// [Feed.Detach] they return an error or do nothing.
type Feed[K comparable] struct {
	l        feedTarget[K]
	requests chan struct{} // buffered 1: the Loader asks for a fresh guard
	detached atomic.Bool
	once     sync.Once
}

// feedTarget is what a Feed drives: a *Loader[K, V] of any V.
type feedTarget[K comparable] interface {
	applyChange(c Change[K]) error
	resync(ctx context.Context, fill func(ctx context.Context, add func(K) error) error) error
	replaceGuard(g *guard.Guard) error
	detach(f *Feed[K])
	MarkReady()
	Invalidate()
	Guard() *guard.Guard
}

// AttachFeed declares that a change stream keeps this Loader in step with
// the store, and returns its handle (see [Feed]). It invalidates the
// Loader, which passes every lookup through until the stream calls
// [Feed.MarkReady], and waits for the Deletes in flight, so that none
// removes a key after it returns. A Loader has at most one feed at a time:
// AttachFeed returns an error while another is attached.
func (l *Loader[K, V]) AttachFeed() (*Feed[K], error) {
	f := &Feed[K]{l: l, requests: make(chan struct{}, 1)}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if !l.feed.CompareAndSwap(nil, f) {
		return nil, errors.New("guarded: the Loader has a change feed already")
	}
	l.Invalidate()
	return f, nil
}

// Requests returns the channel on which the Loader asks for a fresh guard:
// a value means "Resync when you can". It is buffered: a request made
// while one is pending is merged with it.
func (f *Feed[K]) Requests() <-chan struct{} { return f.requests }

// request asks the stream for a resync without waiting.
func (f *Feed[K]) request() {
	select {
	case f.requests <- struct{}{}:
	default: // one is pending already
	}
}

// Apply applies one committed write: a created key is added to the guard
// (and to a guard being built by Resync), a deleted one removed. Report
// each committed write once, in commit order: every delete, this process's
// own included, and the creations made by other processes (this process's
// own were added by [Loader.Insert]).
func (f *Feed[K]) Apply(c Change[K]) error {
	if f.detached.Load() {
		return errDetached
	}
	return f.l.applyChange(c)
}

// Resync builds a fresh guard while the Loader passes every lookup through,
// and swaps it in; the Loader stays invalid until the stream has applied
// the changes the read did not see and calls [Feed.MarkReady]. fill gets a
// function that adds a key to the fresh guard; inserts made through the
// Loader meanwhile reach that guard too. A stream calls it to start over:
// read every key, then the changes the read did not see.
func (f *Feed[K]) Resync(ctx context.Context, fill func(ctx context.Context, add func(K) error) error) error {
	switch {
	case ctx == nil:
		return errNil("Feed.Resync", "ctx")
	case fill == nil:
		return errNil("Feed.Resync", "fill")
	case f.detached.Load():
		return errDetached
	}
	return f.l.resync(ctx, fill)
}

// Replace installs g, a guard the stream restored (see [guard.Restore]),
// as the Loader's guard, and takes ownership of it; the old one is
// closed. The Loader is invalid until [Feed.MarkReady]: apply the changes
// since g was saved first. g may have another seed than the guard it
// replaces (a guard saved by an earlier process); the Loader's rebuilds
// keep g's.
func (f *Feed[K]) Replace(g *guard.Guard) error {
	switch {
	case g == nil:
		return errNil("Feed.Replace", "g")
	case f.detached.Load():
		return errDetached
	}
	return f.l.replaceGuard(g)
}

// MarkReady declares that the guard holds every key of the store.
func (f *Feed[K]) MarkReady() {
	if !f.detached.Load() {
		f.l.MarkReady()
	}
}

// Invalidate declares that the guard may lack keys (the stream was
// interrupted): every lookup passes through until MarkReady.
func (f *Feed[K]) Invalidate() {
	if !f.detached.Load() {
		f.l.Invalidate()
	}
}

// Guard returns the guard lookups use now, for a stream that saves it
// (with [guard.Guard.WriteTo]) next to its position.
func (f *Feed[K]) Guard() *guard.Guard { return f.l.Guard() }

// Detach ends the feed: the Loader is invalidated (without the stream it
// cannot know what the guard lacks), its Deletes remove their keys again,
// and another feed may attach. Detach is idempotent.
func (f *Feed[K]) Detach() {
	f.once.Do(func() {
		f.detached.Store(true)
		f.l.detach(f)
	})
}

// detach is Feed.Detach's part in the Loader.
func (l *Loader[K, V]) detach(f *Feed[K]) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	l.Invalidate()
	l.feed.CompareAndSwap(f, nil)
}

// applyChange is Feed.Apply's part in the Loader.
func (l *Loader[K, V]) applyChange(c Change[K]) error {
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	cur, sh := l.cur.Load(), l.shadow.Load()
	h := l.codec.hash(cur.g, c.Key)
	if c.Deleted {
		l.flight.forget(h, c.Key)
		cur.g.RemoveHash(h)
		return nil
	}
	l.epoch(h).Add(1) // voids negative-cache entries of the key
	if _, err := l.add(cur, h); err != nil {
		return wrap("apply", err)
	}
	if sh != nil {
		l.add(sh, l.codec.hash(sh.g, c.Key)) // a failed rebuild closes sh: nothing to keep
	}
	// As in Insert: later lookups must not join a store call that began
	// before the row existed, nor trust what such a call cached.
	l.flight.forget(h, c.Key)
	l.epoch(h).Add(1)
	return nil
}

// resync is Feed.Resync's part in the Loader.
func (l *Loader[K, V]) resync(ctx context.Context, fill func(ctx context.Context, add func(K) error) error) error {
	l.Invalidate()
	err := l.replace(ctx, func(ctx context.Context, nv *view) (int64, error) {
		var n int64
		add := func(k K) error {
			n++
			_, err := l.add(nv, l.codec.hash(nv.g, k))
			return err
		}
		err := fill(ctx, add)
		return n, err
	})
	if err != nil {
		return wrap("resync", err)
	}
	return nil
}

// replaceGuard is Feed.Replace's part in the Loader. It swaps g in as
// replace does at the end of a rebuild, under writeMu: no Insert is
// between its guard add and the end of its write, and each one hashes its
// key with the guard it adds to (whose seed may change here).
func (l *Loader[K, V]) replaceGuard(g *guard.Guard) error {
	if g.Closed() {
		return errors.New("guarded: Feed.Replace: the guard is closed")
	}
	if !own(g) {
		return errOwned
	}
	l.rebuildMu.Lock() // rebuilds and resyncs take turns with it
	defer l.rebuildMu.Unlock()
	l.Invalidate()
	return l.swapIn(newView(g))
}
