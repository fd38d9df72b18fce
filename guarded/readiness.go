package guarded

import (
	"context"
	"errors"
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
// then leaves the Loader as ready as it was. [KeysOf] turns a slice's or a
// map's keys into keys.
//
// Fill is the warm-up of a Loader: once per Loader. It returns an error,
// and adds nothing, while another Fill runs, after one succeeded, and on a
// Loader that is ready (say, after [Loader.CatchUp]): a second pass would
// add a second copy of every key. After a Fill that failed, call it again.
// To build the guard anew from the store, a Loader rebuilds on its own
// ([KeyLister]), and a change feed calls [Feed.Resync].
func (l *Loader[K, V]) Fill(ctx context.Context, keys iter.Seq2[K, error]) error {
	switch {
	case ctx == nil:
		return errNil("Fill", "ctx")
	case keys == nil:
		return errNil("Fill", "keys")
	case l.isClosed():
		return ErrClosed
	case l.ready.load() != notReady:
		return errors.New("guarded: Fill: the Loader is ready already: a second pass would add every key again")
	case !l.filled.CompareAndSwap(false, true):
		return errors.New("guarded: Fill: called again after a Fill that ran or runs: a second pass would add every key again")
	}
	start := time.Now()
	n, err := l.fill(ctx, l.cur.Load(), keys, 0) // the read may have begun before any insert: it settles nothing
	if err != nil {
		l.filled.Store(false) // may be tried again
		return wrap("fill", err)
	}
	l.ready.set(true)
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: guard filled",
		slog.Int64("keys", n), slog.Duration("took", time.Since(start)))
	l.checkFPR()
	return nil
}

// KeysOf adapts keys, which cannot fail, to what [Loader.Fill] reads:
//
//	err := users.Fill(ctx, guarded.KeysOf(maps.Keys(byID)))  // a map's keys
//	err := users.Fill(ctx, guarded.KeysOf(slices.Values(ids))) // a slice
func KeysOf[K any](keys iter.Seq[K]) iter.Seq2[K, error] {
	if keys == nil {
		return nil // Fill says so
	}
	return func(yield func(K, error) bool) {
		for k := range keys {
			if !yield(k, nil) {
				return
			}
		}
	}
}

// fill adds keys to v's guard and returns how many it added. A read
// that began after the unknown outcomes recorded up to settleSeq settles
// those of the keys it finds (0: none).
func (l *Loader[K, V]) fill(ctx context.Context, v *view, keys iter.Seq2[K, error], settleSeq uint64) (int64, error) {
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
		h := l.codec.hash(v.g, k)
		if settleSeq != 0 {
			// Every later read finds it too. Lookups that find it settled
			// must not join a call that began before its row showed.
			l.unsettled.readSettles(h, settleSeq, func() { l.flight.forget(h, k) })
		}
		batch = append(batch, h)
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

// CatchUp applies, in commit order, the store's writes since the guard's
// snapshot was written (see [guard.Restore]) and marks the Loader ready. Until
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
	switch {
	case ctx == nil:
		return errNil("CatchUp", "ctx")
	case changes == nil:
		return errNil("CatchUp", "changes")
	}
	if l.ready.load() != notReady {
		return errors.New("guarded: catch up: the Loader is ready already; CatchUp is for a Loader over a restored guard")
	}
	v := l.cur.Load()
	n := 0
	for c, err := range changes {
		if err != nil {
			return wrap("catch up", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		h := l.codec.hash(v.g, c.Key)
		if c.Deleted {
			remove(v, h)
		} else if _, err := l.add(v, h); err != nil {
			return wrap("catch up", err)
		}
		n++
	}
	l.ready.set(true)
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: guard caught up", slog.Int("changes", n))
	return nil
}

// MarkReady declares that the guard holds every key of the store, for a
// caller that filled it directly. The Loader is ready until [Loader.Invalidate],
// without a lease (see [Feed.ReadyUntil]).
func (l *Loader[K, V]) MarkReady() {
	l.ready.set(true)
}

// readyUntil is Feed.ReadyUntil's part in the Loader.
func (l *Loader[K, V]) readyUntil(t time.Time) {
	l.ready.lease(t)
}

// Invalidate declares that the guard may lack keys of the store (for
// example, a change feed was interrupted): every lookup passes through
// until the Loader is ready again ([Feed.MarkReady], [Loader.Fill],
// [Loader.CatchUp] or [Loader.MarkReady]).
func (l *Loader[K, V]) Invalidate() {
	l.ready.set(false)
	l.negGen.Add(1) // rows may have appeared that no insert told us of
}
