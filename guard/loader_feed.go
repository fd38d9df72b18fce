package guard

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Fill adds every key of keys to the guard, in parallel ([WithFillWorkers]),
// reporting progress ([WithFillProgress]), and marks the Loader ready when
// it has added them all. Give it every key of the store, read after the
// Loader was made, with writes going through [Loader.Insert] and
// [Loader.Delete] meanwhile (a key both written and read is added twice,
// which is harmless; a Delete during the fill leaves its key in the guard,
// a false positive). It returns the key source's error or ctx.Err() and
// then leaves the Loader as ready as it was.
func (l *Loader[K, V]) Fill(ctx context.Context, keys iter.Seq2[K, error]) error {
	start := time.Now()
	n, err := l.fill(ctx, l.cur.Load(), keys)
	if err != nil {
		return fmt.Errorf("guard: fill: %w", err)
	}
	l.ready.Store(true)
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: guard filled",
		slog.Int64("keys", n), slog.Duration("took", time.Since(start)))
	l.checkFPR()
	return nil
}

// fill adds keys to v's guard and returns how many it added.
func (l *Loader[K, V]) fill(ctx context.Context, v *view, keys iter.Seq2[K, error]) (int64, error) {
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(l.cfg.fillWorkers)
	var added atomic.Int64
	var progressMu sync.Mutex
	batch := make([]uint64, 0, DefaultFillBatch)
	flush := func() {
		b := batch
		batch = make([]uint64, 0, DefaultFillBatch)
		eg.Go(func() error {
			for _, h := range b {
				if _, err := l.add(v, h); err != nil {
					return err
				}
			}
			n := added.Add(int64(len(b)))
			if l.cfg.progress != nil {
				progressMu.Lock()
				l.cfg.progress(n)
				progressMu.Unlock()
			}
			return nil
		})
	}
	var srcErr error
	for k, err := range keys {
		if err != nil {
			srcErr = err
			break
		}
		if ectx.Err() != nil {
			break
		}
		batch = append(batch, l.codec.hash(v.g, k))
		if len(batch) == cap(batch) {
			flush()
		}
	}
	if srcErr == nil && len(batch) > 0 {
		flush()
	}
	if err := eg.Wait(); err != nil {
		return added.Load(), err
	}
	if srcErr != nil {
		return added.Load(), srcErr
	}
	return added.Load(), ctx.Err()
}

// Change is one write to the store, for [Loader.CatchUp] and
// [Loader.Apply].
type Change[K comparable] struct {
	Key     K
	Deleted bool // the row was deleted; else it was created
}

// CatchUp applies, in commit order, the store's writes since the guard's
// snapshot was written (see [Restore]) and marks the Loader ready. Until
// then a Loader over a restored guard passes every lookup through, because
// the snapshot is older than the store.
//
// Report every committed write once, this process's own included: a Delete
// made through the Loader while it catches up does not remove its key
// itself (the Loader is not ready), so CatchUp's replay is that delete's
// only removal. Report a deletion only for a row that existed when the
// snapshot was written or was created by an earlier change: removing a key
// the guard never had could remove another key's copy. CatchUp returns an
// error, and changes nothing, if the Loader is ready already (its Deletes
// then removed their keys themselves, and a replay would remove them
// twice). If the store cannot list its changes, start from an empty guard
// and call [Loader.Fill] instead.
func (l *Loader[K, V]) CatchUp(ctx context.Context, changes iter.Seq2[Change[K], error]) error {
	if l.ready.Load() {
		return errors.New("guard: catch up: the Loader is ready already; CatchUp is for a Loader over a restored guard")
	}
	v := l.cur.Load()
	n := 0
	for c, err := range changes {
		if err != nil {
			return fmt.Errorf("guard: catch up: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		h := l.codec.hash(v.g, c.Key)
		if c.Deleted {
			v.g.RemoveHash(h)
		} else if _, err := l.add(v, h); err != nil {
			return fmt.Errorf("guard: catch up: %w", err)
		}
		n++
	}
	l.ready.Store(true)
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: guard caught up", slog.Int("changes", n))
	return nil
}

// MarkReady declares that the guard holds every key of the store, for a
// caller that filled it directly.
func (l *Loader[K, V]) MarkReady() {
	l.ready.Store(true)
}

// Invalidate declares that the guard may lack keys of the store (for
// example, a change feed was interrupted): every lookup passes through
// until the Loader is ready again ([Loader.Resync], [Loader.Fill],
// [Loader.CatchUp] or [Loader.MarkReady]).
func (l *Loader[K, V]) Invalidate() {
	l.ready.Store(false)
	l.negGen.Add(1) // rows may have appeared that no insert told us of
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
//     whose snapshot it can order against its changes. The key source
//     ([WithKeySource]) is not used.
//
// AttachFeed invalidates the Loader, which passes every lookup through
// until the feed has resynced and calls [Loader.MarkReady], and waits for
// the Deletes in flight, so that none removes a key after it returns.
// detach invalidates the Loader too: without the feed it cannot know what
// the guard lacks. A Loader has at most one feed at a time: AttachFeed
// returns an error while another is attached.
func (l *Loader[K, V]) AttachFeed(resync func()) (detach func(), err error) {
	if resync == nil {
		return nil, errors.New("guard: AttachFeed needs a resync function")
	}
	h := &feedHook{resync: resync}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if !l.feed.CompareAndSwap(nil, h) {
		return nil, errors.New("guard: the Loader has a change feed already")
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
var errNoFeed = errors.New("guard: Apply needs a change feed: call AttachFeed first")

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
		return fmt.Errorf("guard: apply: %w", err)
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
		return fmt.Errorf("guard: resync: %w", err)
	}
	return nil
}
