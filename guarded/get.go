package guarded

import (
	"context"
	"sync/atomic"
)

// MayContain reports whether Get might find key in the store: false only
// when the Loader is ready and the guard knows the key is absent. It only
// asks: it does not call the store, changes no counter of [Loader.Stats]
// (HTTP middleware that asks before a handler's Get would count each
// request twice; the middleware counts its own), and does not allocate
// for string and integer keys.
func (l *Loader[K, V]) MayContain(key K) bool {
	key, judged := l.canon(key)
	if !judged {
		return true
	}
	until, v := l.readyView()
	h := l.codec.hash(v.g, key)
	return until == notReady || v.passes(h) || v.g.ContainsHash(h) || v.over.owes(h) || !l.ready.holds(until)
}

// MayContainContext is [Loader.MayContain] for a lookup made under ctx:
// if ctx carries a [Token] ([WithToken]), it answers false only once the
// Loader's stream has reached the token, waiting for it up to
// [WithTokenWait] (or until ctx ends) and answering true if it has not.
func (l *Loader[K, V]) MayContainContext(ctx context.Context, key K) bool {
	if tokensUsed.Load() && !l.afterToken(ctx) {
		return true
	}
	return l.MayContain(key)
}

// Get returns the value of key. If the Loader is ready and the guard knows
// the key is absent, Get returns [ErrNotFound] without calling the store.
// Otherwise it calls the store, sharing one call among concurrent Gets of
// the same key.
//
// A store "not found" (see [WithNotFound]) is returned as ErrNotFound
// itself, not as the store's error, so that a missing key reads the same
// whether the guard or the store answered, before and after warm-up; if
// the guard had let the key through, it counts as an observed false
// positive.
//
// If ctx carries a [Token] ([WithToken]), Get answers ErrNotFound from
// the guard only once the Loader's stream has reached the token, waiting
// for it up to [WithTokenWait], and otherwise asks the store.
//
// The shared call runs under the context of the Get that started it
// (bounded by [WithLoadTimeout] if set). A Get whose ctx ends stops
// waiting and returns ctx.Err(); if it was the one whose call was running,
// that call ends too (the store stops working for nobody) and the Gets
// still waiting start a new one. One caller leaving never fails the others.
//
// If the store's lookup panics (or calls runtime.Goexit), the panic goes
// on in the Get that ran it, with the stack where it happened; the Gets
// that waited on that call get an error that says so and wraps the panic's
// value if it is an error, and the next Get of the key calls the store
// again, as with golang.org/x/sync/singleflight.
func (l *Loader[K, V]) Get(ctx context.Context, key K) (V, error) {
	var zero V
	if ctx == nil {
		return zero, errNil("Get", "ctx")
	}
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	// The generation before the guard: a swap of the guard, an insert of
	// key or a resync that happens after this point voids what we may
	// cache below.
	key, judged := l.canon(key)
	// A token waits for the stream before the guard is read (token.go);
	// without one this is an atomic load.
	if tokensUsed.Load() && !l.afterToken(ctx) {
		judged = false
	}
	gen := l.negGen.Load()
	until, v := l.readyView()
	h := l.codec.hash(v.g, key)
	guarded := judged && until != notReady && !v.passes(h)
	if !guarded && v.recheckAt != 0 {
		l.recheck(v)
	}
	if guarded && !v.g.ContainsHash(h) && !v.over.owes(h) {
		// screen's first case, written out: the path the Loader exists
		// for, 21 ns, of which the call cost 6% (BenchmarkLoaderGet).
		// The clock is read for an answer "absent" only (lease.go).
		if l.ready.holds(until) {
			l.avoided.Inc()
			return zero, ErrNotFound
		}
		guarded = false
	} else if guarded && l.neg != nil && !l.ready.holds(until) {
		guarded = false // the negative cache answers "absent" too
	}
	d, absent := l.screenMaybe(key, h, gen, guarded)
	if absent {
		return zero, ErrNotFound
	}
	val, err := l.flight.do(ctx, h, key, l.load)
	return l.settle(ctx, key, d, val, err)
}

// screening is what Get and GetMany knew of a key before they asked the
// store: whether the guard was consulted, so that a store "not found" is
// a false positive, and the negative cache's epoch and generation then.
type screening struct {
	guarded    bool
	epoch, gen uint64
	h          uint64 // the key's hash
	// unsettled: an insert of the key had an unknown outcome, and the
	// store had not settled it when the lookup began (see unsettled).
	unsettled bool
}

// screen decides and counts, for Get and GetMany alike, whether the store
// must be asked for key (hash h, negative-cache generation gen): not if
// guarded (the Loader is ready and h's shard took every key) and the
// guard says the key is absent (maybe false), or the negative cache knows
// it is. absent reports that ErrNotFound is the answer. GetMany calls it;
// Get, which asks the guard itself, writes out the first case and calls
// screenMaybe.
func (l *Loader[K, V]) screen(key K, h, gen uint64, guarded, maybe bool) (s screening, absent bool) {
	if guarded && !maybe {
		l.avoided.Inc()
		return screening{}, true
	}
	return l.screenMaybe(key, h, gen, guarded)
}

// screenMaybe is screen for a key the guard may hold, or did not judge.
// The epoch is read here, before the store: an insert of the key after it
// voids what settle caches.
func (l *Loader[K, V]) screenMaybe(key K, h, gen uint64, guarded bool) (s screening, absent bool) {
	if !guarded {
		l.passed.Inc()
		return screening{h: h, unsettled: l.unsettled.mayShow(h, l.cfg.now)}, false
	}
	s = screening{guarded: true, epoch: l.epoch(h).Load(), gen: gen, h: h}
	s.unsettled = l.unsettled.mayShow(h, l.cfg.now) // after the epoch: see settle
	if l.neg != nil && l.neg.has(key, s.epoch, gen) {
		l.negHits.Inc()
		return s, true
	}
	l.letThrough.Inc()
	return s, false
}

// settle turns the store's answer for a key screened as s into the
// caller's: a store "not found" (see WithNotFound) becomes ErrNotFound,
// and for a guarded key it is a false positive, counted and learnt by the
// negative cache.
//
// A "not found" for a key whose insert's outcome is unknown when the
// lookup began or ended (or while such an outcome the Loader could not
// remember may still show, see unsettled) is asked again, in a store call
// of this caller's own: the shared call that answered may have begun
// before the row became visible, which no write of this Loader's marks
// (an Insert makes later lookups start a call of their own; a late commit
// cannot). A read that settles the key makes later lookups start their
// own call first (see fill).
func (l *Loader[K, V]) settle(ctx context.Context, key K, s screening, val V, err error) (V, error) {
	if err == nil || !l.notFound(err) {
		return val, err
	}
	unsettled := s.unsettled || l.unsettled.mayShow(s.h, l.cfg.now)
	if unsettled {
		if val, err = l.load(ctx, key); err == nil || !l.notFound(err) {
			return val, err
		}
	}
	if s.guarded {
		l.falsePos.Inc()
		// Not for a key whose insert's outcome is unknown: its row may
		// become visible later, with no write of ours to void the entry.
		// The insert records the key before it bumps the epoch read
		// before the store call, so a lookup that began after that bump
		// sees the record.
		if l.neg != nil && !unsettled {
			l.neg.add(key, s.epoch, s.gen)
		}
	}
	return *new(V), ErrNotFound
}

// readyView returns the Loader's readiness, for [readiness.holds], and
// the view lookups use.
//
// ready before cur: a resync swaps in its guard and then sets ready, so a
// true ready guarantees that the guard loaded next is that one. And a
// caller that reads negGen before calling readyView sees the guard that was
// current at that generation or a later one: a swap stores cur before it
// bumps negGen. Negative-cache entries are keyed by the generation, so one
// cached under a hash of an old guard's seed is never trusted after the
// swap.
func (l *Loader[K, V]) readyView() (int64, *view) {
	until := l.ready.load()
	return until, l.cur.Load()
}

// load is one call of the store's lookup, bounded by WithLoadTimeout.
func (l *Loader[K, V]) load(ctx context.Context, key K) (V, error) {
	ctx, cancel := l.bound(ctx)
	defer cancel()
	l.storeCalls.Inc()
	return l.src.get(ctx, key)
}

// bound returns ctx with the deadline of WithLoadTimeout, if one is set,
// for one call of the store. Without one it returns ctx itself: a
// cancellable context per lookup costs database/sql a watcher goroutine.
func (l *Loader[K, V]) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if l.cfg.loadTimeout > 0 {
		return context.WithTimeout(ctx, l.cfg.loadTimeout)
	}
	return ctx, func() {}
}

func (l *Loader[K, V]) epoch(h uint64) *atomic.Uint64 {
	return &l.epochs[h%uint64(len(l.epochs))]
}
