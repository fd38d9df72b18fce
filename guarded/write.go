package guarded

import (
	"cmp"
	"context"
	"errors"
	"sync"

	"github.com/cuckooguard/cuckooguard/guard"
)

// Insert writes key to the store through write, keeping the guard in step:
// it adds key to the guard before write runs, so that no lookup can see the
// new row before the guard has its key. If write fails, Insert removes the
// key again only when the error shows that nothing was written (see
// [WithRollback] and [NotWritten]); otherwise it keeps the key, a possible
// false positive, because a row that was written after all must never read
// absent.
//
// Insert adds one copy per row created: call it once per row. Concurrent
// Inserts of one key run one after the other (a later one waits for the
// earlier one's write, or for its own ctx), so requests retried or
// duplicated while a write is slow add one copy, not one each.
//
// write gets ctx as it is. Insert returns write's error; ctx.Err() if ctx
// ended before write ran (the guard is then unchanged); or an error if the
// guard cannot take the key (write is then not called). If write panics,
// its outcome is unknown: the key stays, and the panic goes on.
func (l *Loader[K, V]) Insert(ctx context.Context, key K, write func(ctx context.Context) error) error {
	switch {
	case ctx == nil:
		return errNil("Insert", "ctx")
	case write == nil:
		return errNil("Insert", "write")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	key, err := l.canonWrite("Insert", key)
	if err != nil {
		return err
	}
	// The lock's stripe comes from the hash of the guard in use now. A
	// feed's Replace may change the seed before the lock is taken (it
	// waits for writeMu, below), so that two Inserts of one key may run
	// at once, once: one extra copy at most.
	lh := l.Hash(key)
	if err := l.inserts.lock(ctx, lh, key); err != nil {
		return err
	}
	defer l.inserts.unlock(lh, key)
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	// Under writeMu the guards cannot change: hash the key with each.
	cur, sh := l.cur.Load(), l.shadow.Load()
	h := l.codec.hash(cur.g, key)
	e := l.epoch(h)
	e.Add(1)
	inCur, err := l.add(cur, h)
	if err != nil {
		return wrap("insert", err)
	}
	inShadow, hs := false, uint64(0)
	if sh != nil {
		hs = l.codec.hash(sh.g, key)
		inShadow, _ = l.add(sh, hs) // a failed rebuild closes sh: nothing to keep
	}
	rolledBack, returned := false, false
	var werr error
	mark := l.unsettled.mark() // a success settles the records made before the write
	defer func() {
		if rolledBack {
			return
		}
		// The row may exist now (write returned, or panicked: its outcome
		// is unknown, and the key stays). Lookups that began before the
		// write may have joined a store call that missed the row: later
		// ones must not join it, nor trust a negative entry cached by it.
		l.flight.forget(h, key)
		// Under writeMu, so that a rebuild that begins after this insert
		// finds the key among the unsettled ones; before the epoch's
		// bump, so that a lookup that begins after the bump does not
		// cache the key as absent (see settle).
		l.noteOutcome(h, !returned || werr != nil, cur, mark)
		e.Add(1)
	}()
	werr = write(ctx)
	returned = true
	if werr != nil && l.cfg.notWritten(werr) {
		if inCur {
			remove(cur, h)
		}
		if inShadow {
			remove(sh, hs)
		}
		rolledBack = true
		return werr
	}
	if l.insertN.Add(1)%4096 == 0 {
		l.checkFPR()
	}
	return werr
}

// InsertGenerated writes rows whose keys the store generates as it writes
// them (a serial or identity column, DEFAULT gen_random_uuid()), keeping
// the guard in step as [Loader.Insert] does: write runs the insert and,
// before it commits, calls add with each key the insert returned (INSERT
// … RETURNING id), once per row; add puts the key in the guard, so that no
// lookup can see the row before the guard has its key. Calling add after
// the commit leaves a window in which the row reads absent. add returns
// an error if the guard cannot take the key, which write should return
// (its transaction then rolls back).
//
// If write fails, the keys it added are taken back only when the error
// shows that nothing was written (see [WithRollback]); otherwise they stay,
// a possible false positive. With a change feed, name the added keys in
// the transaction as the feed requires (postgres: Follower.Tag with the
// same keys), so that the feed skips exactly those inserts.
//
// InsertGenerated returns write's error, ctx.Err() if ctx ended before
// write ran, or add's error. If write panics, its outcome is unknown: the
// keys it added stay, and the panic goes on.
func (l *Loader[K, V]) InsertGenerated(ctx context.Context, write func(ctx context.Context, add func(K) error) error) error {
	switch {
	case ctx == nil:
		return errNil("InsertGenerated", "ctx")
	case write == nil:
		return errNil("InsertGenerated", "write")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	cur, sh := l.cur.Load(), l.shadow.Load()
	type added struct {
		key          K
		h, hs        uint64
		inCur, inShd bool
	}
	var mu sync.Mutex // add may be called from the goroutines of write
	var keys []added
	var addErr error
	returned := false
	add := func(key K) error {
		key, err := l.canonWrite("InsertGenerated", key)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if returned {
			return errors.New("guarded: InsertGenerated: add called after write returned")
		}
		a := added{key: key, h: l.codec.hash(cur.g, key)}
		l.epoch(a.h).Add(1)
		if a.inCur, err = l.add(cur, a.h); err != nil {
			err = wrap("insert", err)
			addErr = cmp.Or(addErr, err)
			return err
		}
		if sh != nil {
			a.hs = l.codec.hash(sh.g, key)
			a.inShd, _ = l.add(sh, a.hs) // a failed rebuild closes sh: nothing to keep
		}
		keys = append(keys, a)
		return nil
	}
	rolledBack, wrote := false, false
	var werr error
	mark := l.unsettled.mark() // a success settles the records made before the write
	defer func() {
		// Whatever write did (it may have panicked), add is closed now: a
		// goroutine of write that calls it late gets an error rather than
		// a key in the guard that nothing accounts for.
		mu.Lock()
		returned = true
		mu.Unlock()
		if rolledBack {
			return
		}
		// In a defer, as in Insert, so that it runs when write panics
		// after its commit too: the rows may exist now, and lookups that
		// began before the write may have joined a store call that missed
		// them. Later ones must not join it, nor trust a negative entry
		// it cached.
		unclear := !wrote || werr != nil
		for _, a := range keys {
			l.flight.forget(a.h, a.key)
			l.noteOutcome(a.h, unclear, cur, mark) // under writeMu, before the bump, as in Insert
			l.epoch(a.h).Add(1)
		}
	}()
	werr = write(ctx, add)
	wrote = true
	mu.Lock()
	returned = true
	if werr == nil {
		werr = addErr
	}
	mu.Unlock()
	if werr != nil && l.cfg.notWritten(werr) {
		for _, a := range keys {
			if a.inCur {
				remove(cur, a.h)
			}
			if a.inShd {
				remove(sh, a.hs)
			}
		}
		rolledBack = true
		return werr
	}
	if n := uint64(len(keys)); n > 0 && l.insertN.Add(n)%4096 < n {
		l.checkFPR()
	}
	return werr
}

// Delete deletes key from the store through write, which reports whether a
// row existed. Only then, and only after write returned, does Delete remove
// key from the guard, and only if the Loader was ready when Delete began
// and has no change feed (see [Loader] for why). It returns write's error
// or ctx.Err().
func (l *Loader[K, V]) Delete(ctx context.Context, key K, write func(ctx context.Context) (existed bool, err error)) error {
	switch {
	case ctx == nil:
		return errNil("Delete", "ctx")
	case write == nil:
		return errNil("Delete", "write")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	key, _ = l.canon(key) // a key the rule cannot judge was never added in another form
	// The guard that was complete when the write began is the one to
	// remove the key from: a guard still warming up, or one a rebuild
	// swapped in meanwhile, may never have had it (its read ran after the
	// delete), and removing a key a guard does not hold can remove
	// another key. writeMu keeps swaps out until we are done.
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	cur := l.cur.Load()
	removes := l.ready.load() != notReady && l.feed.Load() == nil
	// The row the write finds settles the unknown outcomes recorded
	// before it began, and no later one: an insert of the key that began
	// after the row was gone may record one before write returns here,
	// and its row, if it commits, must survive the rebuilds until then.
	mark := l.unsettled.mark()
	existed, err := write(ctx)
	if err != nil || !existed {
		return err
	}
	h := l.codec.hash(cur.g, key)
	l.flight.forget(h, key)
	l.unsettled.settledBefore(h, mark) // its row existed: the store settled the unknown outcomes before the write
	if removes {
		remove(cur, h)
	}
	return nil
}

// remove removes one copy of h from v: a copy owed (view.over) if there
// is one, else one the guard holds.
func remove(v *view, h uint64) {
	if !v.over.take(h) {
		v.g.RemoveHash(h)
	}
}

// noteOutcome records how an insert of the key with hash h into view v
// ended, for rebuilds: a write whose outcome is unknown (unclear: it
// failed with an error that did not prove it wrote nothing, or panicked)
// leaves its key unsettled; a write that succeeded settles the records
// of the key made up to mark, taken before the write began. It also asks
// for the rebuild that v is waiting for (see view.recheckAt). The caller
// holds writeMu.
func (l *Loader[K, V]) noteOutcome(h uint64, unclear bool, v *view, mark uint64) {
	if unclear {
		if !l.cfg.forgetUnknown {
			l.unsettled.record(h, l.cfg.now().UnixNano())
		}
	} else {
		l.unsettled.settledBefore(h, mark)
	}
	l.recheck(v)
}

// add adds hash h to the guard of v and reports whether it did. A full
// shard is marked to pass its lookups through, and a rebuild is started.
func (l *Loader[K, V]) add(v *view, h uint64) (bool, error) {
	err := v.g.AddHash(h)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, guard.ErrTooManyCopies) {
		// The guard holds guard.MaxCopies copies of the key (or of keys it
		// cannot tell from it): present for now. The copy is owed rather
		// than dropped (view.over): a feed's deletions may come for each
		// copy added (a key deleted and inserted again through the Loader
		// faster than the stream follows), and the first removals take
		// the owed copies, not the ones the guard holds; and if the
		// copies were other keys', their removals may take every one of
		// them, so lookups count an owed copy as present.
		v.over.add(h)
		return true, nil
	}
	if errors.Is(err, guard.ErrClosed) {
		if v != l.cur.Load() && v != l.shadow.Load() {
			// A rebuild replaced v while a Fill or CatchUp was adding to
			// it. The new guard was filled from the key source after every
			// write in flight had finished, so it covers this key already.
			return false, nil
		}
		return false, ErrClosed // the Loader was closed
	}
	if !errors.Is(err, guard.ErrFull) {
		return false, err
	}
	v.markPass(v.g.ShardIndex(h)) // the guard marked it already; the view's copy is what lookups read
	l.rebuild()
	return false, nil
}

// keyLocks lets one holder per key at a time through, waiting with a
// context. An uncontended lock allocates nothing: a waiter makes the
// channel the holder closes.
type keyLocks[K comparable] struct {
	held striped[K, chan struct{}] // the channel, once a waiter made it, closes on unlock
}

// lock waits until key is free or ctx ends, and takes it.
func (k *keyLocks[K]) lock(ctx context.Context, h uint64, key K) error {
	st := k.held.of(h)
	for {
		st.mu.Lock()
		ch, held := st.m[key]
		if !held {
			st.put(key, nil)
			st.mu.Unlock()
			return nil
		}
		if ch == nil {
			ch = make(chan struct{})
			st.m[key] = ch
		}
		st.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// unlock frees key and wakes its waiters; one of them takes it.
func (k *keyLocks[K]) unlock(h uint64, key K) {
	st := k.held.of(h)
	st.mu.Lock()
	ch := st.m[key]
	delete(st.m, key)
	st.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}
