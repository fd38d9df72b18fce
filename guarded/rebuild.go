package guarded

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
)

// feedResyncInterval is the least time between two resyncs a Loader asks
// of its change feed.
const feedResyncInterval = 10 * time.Second

// checkFPR starts a rebuild if the guard's estimated false-positive rate
// passed the limit.
func (l *Loader[K, V]) checkFPR() {
	if (l.src.keys != nil || l.feed.Load() != nil) && !l.rebuilding.Load() && l.cur.Load().g.Stats().EstimatedFPR > l.cfg.maxFPR {
		l.rebuild()
	}
}

// rebuild starts a background rebuild unless one is running, the Loader
// has no key source, it is closed, or the last rebuild failed less than a
// backoff ago (1 s after the first failure, doubling up to a minute, so
// that a rebuild that cannot succeed, say under a memory cap too small
// for the keys, is not retried on every insert). With a change feed it
// asks the feed to resync instead.
func (l *Loader[K, V]) rebuild() {
	if f := l.feed.Load(); f != nil {
		// The feed's resync reads the whole table: not more than once in
		// feedResyncInterval, however many inserts find a full shard.
		now := l.cfg.now().UnixNano()
		if after := l.rebuildAfter.Load(); now >= after && l.rebuildAfter.CompareAndSwap(after, now+int64(feedResyncInterval)) {
			f.request()
		}
		return
	}
	if l.src.keys == nil || l.cfg.now().UnixNano() < l.rebuildAfter.Load() || !l.rebuilding.CompareAndSwap(false, true) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		l.rebuilding.Store(false)
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer l.rebuilding.Store(false)
		err := l.rebuildNow(l.ctx)
		if errors.Is(err, errFeedAttached) {
			// The feed's own read replaces the guard (AttachFeed
			// invalidated it); the discarded one is no failure.
			l.cfg.logger.LogAttrs(l.ctx, slog.LevelInfo, "cuckooguard: rebuild discarded: a change feed attached while it ran")
			return
		}
		l.mu.Lock()
		if err != nil {
			l.rebuildDelay = min(max(2*l.rebuildDelay, time.Second), time.Minute)
		} else {
			l.rebuildDelay = 0
		}
		l.rebuildAfter.Store(l.cfg.now().Add(l.rebuildDelay).UnixNano())
		l.mu.Unlock()
		if err != nil {
			l.rebuildErrs.Inc()
			l.cfg.logger.LogAttrs(l.ctx, slog.LevelError, "cuckooguard: rebuild failed", slog.Any("error", err))
		}
	}()
}

// rebuildNow builds a fresh guard from the key source while inserts reach
// both guards, then installs it, unless a change feed attached meanwhile.
func (l *Loader[K, V]) rebuildNow(ctx context.Context) error {
	return l.rebuildWith(ctx, byKeySource, func(ctx context.Context, nv *view) (int64, error) {
		// The read begins now, after every record up to nv.settleSeq:
		// a key it finds with such a record is settled.
		return l.fill(ctx, nv, l.src.keys(ctx), nv.settleSeq)
	})
}

// builder says where a rebuild's keys come from.
type builder int

const (
	byKeySource builder = iota // the Loader's own rebuild: a plain read of the store's keys (KeyLister)
	byFeed                     // a change feed's Resync or Replace, ordered against its changes
)

// rebuildWith builds a fresh guard with fill while inserts reach both
// guards, then installs it. Rebuilds and resyncs take turns.
func (l *Loader[K, V]) rebuildWith(ctx context.Context, by builder, fill func(context.Context, *view) (int64, error)) error {
	l.rebuildMu.Lock()
	defer l.rebuildMu.Unlock()
	if by == byKeySource && l.feed.Load() != nil {
		return errFeedAttached // it asks the feed instead (see rebuild)
	}
	start := time.Now()
	old := l.cur.Load()
	ng, err := l.newGuard(old.g)
	if err != nil {
		return wrap("rebuild", err)
	}
	nv := newView(ng)
	l.writeMu.Lock() // waits for inserts in flight: their rows are in the store now, or their keys unsettled
	l.keepUnsettled(nv)
	l.shadow.Store(nv)
	l.writeMu.Unlock()
	n, err := fill(ctx, nv)
	if err != nil {
		l.writeMu.Lock()
		l.shadow.Store(nil)
		l.writeMu.Unlock()
		ng.Close()
		return wrap("rebuild", err)
	}
	if err := l.install(nv, by); err != nil {
		return err
	}
	l.rebuilds.Inc()
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: guard rebuilt",
		slog.Int64("keys", n), slog.Duration("took", time.Since(start)))
	return nil
}

// install makes nv the view lookups use, ends a rebuild's shadow, and
// closes the guard nv replaces. It installs nothing, closes nv's guard and
// returns an error if the Loader is closed (ErrClosed), or if nv was built
// from the key source and a change feed attached meanwhile
// (errFeedAttached): the key source's read is not ordered against the
// feed's changes, and a delete the feed applied after the swap could
// remove a copy that the read never added, another key's. l.mu orders the
// swap against Close, and writeMu against AttachFeed: once Close has
// marked the Loader closed, or a feed has attached, no such guard is
// installed, so none outlives Close. Lock order: writeMu, then l.mu, as in
// an insert that triggers a rebuild. The caller holds rebuildMu, which
// every install takes, so the guard replaced is the one the caller found.
func (l *Loader[K, V]) install(nv *view, by builder) error {
	l.writeMu.Lock()
	l.mu.Lock()
	var refused error
	switch {
	case l.closed:
		refused = ErrClosed
	case by == byKeySource && l.feed.Load() != nil:
		refused = errFeedAttached
	}
	old := l.cur.Load()
	if refused == nil {
		l.cur.Store(nv)
		l.negGen.Add(1) // after the store: see Get
	}
	l.shadow.Store(nil)
	l.mu.Unlock()
	l.writeMu.Unlock()
	if refused != nil {
		nv.g.Close()
		return refused
	}
	old.g.Close()
	return nil
}

// newGuard makes the replacement of g (by default [guard.Guard.Fresh]:
// g's configuration and seed travel with it; see [WithRebuildGuard]),
// sized for g's keys and a quarter more but no smaller than g's own
// capacity. The size comes from the keys g holds, not from its slots: a
// guard that grew for copies since removed would otherwise pass its size
// on.
func (l *Loader[K, V]) newGuard(g *guard.Guard) (*guard.Guard, error) {
	capacity := min(max(g.Len()*5/4, g.Capacity(), 1024), guard.MaxCapacity)
	ng, err := l.cfg.fresh(g, capacity)
	if err != nil {
		return nil, err
	}
	if ng == nil || ng.Seed() != g.Seed() {
		if ng != nil {
			ng.Close()
		}
		return nil, errors.New("the new guard must have the old one's seed (see WithRebuildGuard)")
	}
	if !own(ng) {
		return nil, errOwned
	}
	return ng, nil
}

// keepUnsettled adds to nv, the guard of a rebuild about to read the
// store's keys, every key of an insert whose outcome is unknown (see
// unsettled): its row may become visible after the read. If an unknown
// outcome could not be remembered, nv passes every lookup through until
// its settle time has passed, and asks for a rebuild then. The caller
// holds writeMu, so that no insert is between its write and its record.
func (l *Loader[K, V]) keepUnsettled(nv *view) {
	keys, seq, passUntil := l.unsettled.pending(l.cfg.now().UnixNano())
	nv.settleSeq = seq
	if passUntil != 0 {
		for i := range nv.pass {
			nv.markPass(i)
		}
		nv.recheckAt = passUntil
	}
	for _, h := range keys {
		l.add(nv, h) // a full shard passes through, as for any add
	}
}

// recheck starts the rebuild that view v waits for, once the settle time
// it waits for has passed (see view.recheckAt).
func (l *Loader[K, V]) recheck(v *view) {
	if v.recheckAt != 0 && l.cfg.now().UnixNano() >= v.recheckAt {
		l.rebuild()
	}
}
