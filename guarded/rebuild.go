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
// both guards, then swaps it in.
func (l *Loader[K, V]) rebuildNow(ctx context.Context) error {
	return l.replace(ctx, func(ctx context.Context, nv *view) (int64, error) {
		return l.fill(ctx, nv, l.src.keys(ctx))
	})
}

// replace builds a fresh guard with fill while inserts reach both guards,
// then swaps it in. Rebuilds and resyncs take turns.
func (l *Loader[K, V]) replace(ctx context.Context, fill func(context.Context, *view) (int64, error)) error {
	l.rebuildMu.Lock()
	defer l.rebuildMu.Unlock()
	start := time.Now()
	old := l.cur.Load()
	ng, err := l.newGuard(old.g)
	if err != nil {
		return wrap("rebuild", err)
	}
	nv := newView(ng)
	l.writeMu.Lock() // waits for inserts in flight: their rows are in the store now
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
	if err := l.swapIn(nv); err != nil {
		return err
	}
	l.rebuilds.Inc()
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: guard rebuilt",
		slog.Int64("keys", n), slog.Duration("took", time.Since(start)))
	return nil
}

// swapIn makes nv the view lookups use, ends a rebuild's shadow, and
// closes the guard nv replaces; if the Loader is closed, it closes nv's
// guard instead and returns ErrClosed. l.mu orders the swap against Close:
// once Close has marked the Loader closed no guard is swapped in, so none
// outlives Close. Lock order: writeMu, then l.mu, as in an insert that
// triggers a rebuild. The caller holds rebuildMu, which every swap takes,
// so the guard replaced is the one the caller found.
func (l *Loader[K, V]) swapIn(nv *view) error {
	l.writeMu.Lock()
	l.mu.Lock()
	closed := l.closed
	old := l.cur.Load()
	if !closed {
		l.cur.Store(nv)
		l.negGen.Add(1) // after the store: see Get
	}
	l.shadow.Store(nil)
	l.mu.Unlock()
	l.writeMu.Unlock()
	if closed {
		nv.g.Close()
		return ErrClosed
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
