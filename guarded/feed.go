package guarded

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

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
// calls [Feed.ReadyUntil] (or [Feed.MarkReady]) once the guard has caught
// up; until then, after [Feed.Invalidate], and once the lease that
// ReadyUntil granted runs out, the Loader passes every lookup through. When
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
// Call Apply, Resync, Replace, ReadyUntil, MarkReady and Invalidate from one goroutine,
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
	installSaved(g *guard.Guard) error
	degraded() bool
	detach(f *Feed[K])
	MarkReady()
	readyUntil(t time.Time)
	reached(t Token)
	setKeyRule(canon func(K) (K, error))
	Invalidate()
	Guard() *guard.Guard
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
	return f.l.installSaved(g)
}

// MarkReady declares that the guard holds every key of the store, with no
// end: the Loader answers on the guard alone until [Feed.Invalidate].
// That suits a stream that cannot tell how current it is; one that can
// should call [Feed.ReadyUntil] instead, so that a stream that goes
// silent, or a process that was paused, is not trusted past what it
// proved.
func (f *Feed[K]) MarkReady() {
	if !f.detached.Load() {
		f.l.MarkReady()
	}
}

// ReadyUntil declares that the guard holds every key of the store and
// will be trusted to until t, a lease: from t on, until the next
// ReadyUntil or MarkReady, the Loader passes every lookup through, as if
// invalidated. Each answer "absent" (and [Loader.Ready], and so the
// readiness checks built on it) compares t with the monotonic clock when
// it is given, not when the stream last ran, so a process that wakes from
// a pause passes through until its stream proves it caught up.
//
// A stream extends the lease on evidence, judged by when the evidence was
// sent: a heartbeat sent at s through the store's change stream came back
// behind every change committed before s, so the guard is current as of
// s, and a stream that promises lookups at most maxLag behind the store
// calls ReadyUntil(s.Add(maxLag)). Take t from [time.Now] (it carries the
// monotonic clock's reading: a change of the wall clock moves no lease);
// the package doc says what the clock counts and what it does not.
func (f *Feed[K]) ReadyUntil(t time.Time) {
	if !f.detached.Load() {
		f.l.readyUntil(t)
	}
}

// Reached declares that the guard holds every change of the store's
// stream up to t: the stream applied each committed write at or before
// t's position (or found nothing of the store's between its last one and
// there). Lookups under a token ([WithToken]) of t's stream at or before
// that position no longer wait (see [Token]). Report it after the changes
// are applied, as often as is cheap (each transaction, each heartbeat);
// a stream that starts over from an earlier position (its store was
// restored) reports the earlier one. It changes nothing of readiness: a
// Loader that is not ready passes lookups through whatever their token.
func (f *Feed[K]) Reached(t Token) {
	if !f.detached.Load() && !t.IsZero() {
		f.l.reached(t)
	}
}

// Invalidate declares that the guard may lack keys (the stream was
// interrupted): every lookup passes through until MarkReady.
func (f *Feed[K]) Invalidate() {
	if !f.detached.Load() {
		f.l.Invalidate()
	}
}

// SetKeyRule installs the store's rule for the text of its keys in the
// Loader: canon returns the one form in which the store's keys reach the
// guard (the stream's, the read's), for a key in any text the store
// reads as that key (a citext column's "Alice@Example.com" is
// "alice@example.com"), or an error for a text it cannot judge. From then
// on every entry of the Loader applies it: [Loader.Get], [Loader.GetMany]
// and [Loader.MayContain] (and so the middleware and rpcguard) look up
// the key's form, and pass a key canon cannot judge to the store as it
// is, never answering it absent; [Loader.Insert] and
// [Loader.InsertGenerated] add the key's form, and refuse, writing
// nothing, a key canon cannot judge; the store's lookup gets the key's
// form. A caller need not know the rule. nil removes it, and so does
// [Feed.Detach]. canon must be safe for concurrent use and fast: every
// lookup calls it.
func (f *Feed[K]) SetKeyRule(canon func(K) (K, error)) {
	if !f.detached.Load() {
		f.l.setKeyRule(canon)
	}
}

// Guard returns the guard lookups use now, for a stream that saves it
// (with [guard.Guard.WriteTo]) next to its position. See [Feed.Degraded]
// for a guard whose shards pass lookups through.
func (f *Feed[K]) Guard() *guard.Guard { return f.l.Guard() }

// Degraded reports whether a shard of the current guard passes its lookups
// through because it could not take a key (guard.ErrFull), or because a
// rebuild could not tell which keys of writes with an unknown outcome it
// lacks (see [WithUnsettled]): the Loader knows the key may exist, the
// guard's keys alone do not. The guard carries the mark
// ([guard.Guard.Degraded]), and its snapshots keep it, so that a Loader
// that [Feed.Replace] installed the restored guard in passes those shards
// through again; a stream may also decline to save a degraded guard and
// read the table instead at its next start (the postgres follower does).
// The mark is set before the write of the key it concerns begins, so a
// stream that checks Degraded after applying the changes up to a
// position, and finds it false, saves a guard that holds every key
// created before that position.
func (f *Feed[K]) Degraded() bool { return f.l.degraded() }

// Detach ends the feed: the Loader is invalidated (without the stream it
// cannot know what the guard lacks), its Deletes remove their keys again,
// and another feed may attach. Detach is idempotent.
func (f *Feed[K]) Detach() {
	f.once.Do(func() {
		f.detached.Store(true)
		f.l.detach(f)
	})
}
