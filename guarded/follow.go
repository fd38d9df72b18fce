package guarded

import (
	"context"
	"errors"

	"github.com/cuckooguard/cuckooguard/guard"
)

// The Loader's side of a change feed (the handle is in feed.go).

// AttachFeed declares that a change stream keeps this Loader in step with
// the store, and returns its handle (see [Feed]). It invalidates the
// Loader, which passes every lookup through until the stream calls
// [Feed.MarkReady], and waits for the Deletes in flight, so that none
// removes a key after it returns. A rebuild from the key source that is
// running when the feed attaches is discarded, not installed: its read is
// not ordered against the stream's changes. A Loader has at most one feed
// at a time: AttachFeed returns an error while another is attached.
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

// detach is Feed.Detach's part in the Loader.
func (l *Loader[K, V]) detach(f *Feed[K]) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	l.Invalidate()
	if l.feed.CompareAndSwap(f, nil) {
		l.rule.Store(nil)
		l.reach.clear()
	}
}

// setKeyRule is Feed.SetKeyRule's part in the Loader.
func (l *Loader[K, V]) setKeyRule(canon func(K) (K, error)) {
	if canon == nil {
		l.rule.Store(nil)
		return
	}
	l.rule.Store(&keyRule[K]{canon: canon})
}

// applyChange is Feed.Apply's part in the Loader.
func (l *Loader[K, V]) applyChange(c Change[K]) error {
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	cur, sh := l.cur.Load(), l.shadow.Load()
	h := l.codec.hash(cur.g, c.Key)
	if c.Deleted {
		l.flight.forget(h, c.Key)
		remove(cur, h)
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

// resync is Feed.Resync's part in the Loader: a rebuild whose keys come
// from the stream's read.
func (l *Loader[K, V]) resync(ctx context.Context, fill func(ctx context.Context, add func(K) error) error) error {
	l.Invalidate()
	err := l.rebuildWith(ctx, byFeed, func(ctx context.Context, nv *view) (int64, error) {
		var n int64
		add := func(k K) error {
			n++
			// The stream's read may have begun before an insert whose
			// outcome is unknown: finding its key settles nothing.
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

// installSaved is Feed.Replace's part in the Loader: it installs g, a
// guard the stream saved and restored, as a rebuild installs the guard it
// built (see install), invalid until the stream catches up.
func (l *Loader[K, V]) installSaved(g *guard.Guard) error {
	if g.Closed() {
		return errors.New("guarded: Feed.Replace: the guard is closed")
	}
	if !own(g) {
		return errOwned
	}
	l.rebuildMu.Lock() // rebuilds and resyncs take turns with it
	defer l.rebuildMu.Unlock()
	l.Invalidate()
	nv := newView(g)
	// The saved guard is older than this process's inserts whose outcome
	// is unknown, and the feed skips them as this process's own: keep
	// them, as a rebuild does. Their hashes are of the current guard's
	// seed.
	l.writeMu.Lock()
	if g.Seed() != l.cur.Load().g.Seed() {
		l.unsettled.rehash(l.cfg.now().UnixNano())
	}
	l.keepUnsettled(nv)
	l.writeMu.Unlock()
	return l.install(nv, byFeed)
}

// degraded is Feed.Degraded's part in the Loader.
func (l *Loader[K, V]) degraded() bool {
	return l.cur.Load().passAny.Load()
}
