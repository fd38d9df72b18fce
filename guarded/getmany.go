package guarded

import (
	"context"
	"errors"
)

// GetMany returns the values of keys: vals[i] and errs[i] are what
// [Loader.Get] would return for keys[i]. Keys the guard knows are absent
// get [ErrNotFound] without the store (looked up together, as
// [guard.Guard.ContainsMany] does); the rest go to the store in one call of
// its GetMany if it is a [BatchGetter], or, if not, one Get per key. A key asked for more than once is looked up once. Concurrent Gets
// and GetManys of the same key share one store call, as Gets do, and the
// negative cache ([WithNegativeCache]) answers and learns as for Get. A
// [Token] in ctx is judged once for the batch, as Get judges it.
//
// If the batch lookup fails, every key it was asked for gets its error. If
// ctx ends, the keys not answered yet get ctx.Err(). A batch lookup that
// panics frees its keys and panics on in GetMany, as a lookup does in
// [Loader.Get].
func (l *Loader[K, V]) GetMany(ctx context.Context, keys []K) (vals []V, errs []error) {
	vals, errs = make([]V, len(keys)), make([]error, len(keys))
	err := errNil("GetMany", "ctx")
	if ctx != nil {
		err = ctx.Err()
	}
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return vals, errs
	}
	// The keys in the form of the key rule, if any: spellings of one key
	// are then looked up once. A key the rule cannot judge goes to the
	// store as it is.
	var unjudged []bool
	if l.rule.Load() != nil {
		canon := make([]K, len(keys))
		unjudged = make([]bool, len(keys))
		for i, k := range keys {
			var judged bool
			canon[i], judged = l.canon(k)
			unjudged[i] = !judged
		}
		keys = canon
	}
	tokenOK := !tokensUsed.Load() || l.afterToken(ctx) // before the guard: token.go
	gen := l.negGen.Load()                             // before the guard: see readyView
	until, v := l.readyView()
	hs := make([]uint64, len(keys))
	for i, k := range keys {
		hs[i] = l.codec.hash(v.g, k)
	}
	if v.recheckAt != 0 {
		l.recheck(v)
	}
	maybe := make([]bool, len(keys))
	ready := until != notReady && tokenOK
	if ready {
		v.g.ContainsManyHashes(hs, maybe)
		for i, h := range hs {
			maybe[i] = maybe[i] || v.over.owes(h) // a copy the guard refused (overCopies.owes)
		}
		ready = l.ready.holds(until) // one reading of the clock, after the guard's (lease.go)
	}
	// The keys the store must answer, first occurrence of each; the
	// others copy its answer at the end.
	type pending struct {
		i            int // index of the first occurrence in keys
		s            screening
		c            *call[V] // the call that answers it
		leader, done bool
	}
	var todo []pending
	first := make(map[K]int, len(keys)) // key → index in todo, or -1 if answered already
	for i, k := range keys {
		if _, seen := first[k]; seen {
			continue
		}
		judged := unjudged == nil || !unjudged[i]
		s, absent := l.screen(k, hs[i], gen, judged && ready && !v.passes(hs[i]), maybe[i])
		if absent {
			errs[i], first[k] = ErrNotFound, -1
			continue
		}
		first[k] = len(todo)
		todo = append(todo, pending{i: i, s: s})
	}
	answer := func(p *pending, val V, err error) {
		vals[p.i], errs[p.i] = l.settle(ctx, keys[p.i], p.s, val, err)
		p.done = true
	}
	if batch := l.src.many; batch != nil && len(todo) > 0 {
		// Lead every key nobody is looking up yet, in one store call;
		// join the others.
		var led []K
		for j := range todo {
			p := &todo[j]
			p.c, p.leader = l.flight.begin(hs[p.i], keys[p.i])
			if p.leader {
				led = append(led, keys[p.i])
			}
		}
		if len(led) > 0 {
			var found map[K]V
			var err error
			protect(func() { found, err = l.loadMany(ctx, batch, led) }, func(err error) {
				// The batch lookup panicked: free every key it led.
				for j := range todo {
					if p := &todo[j]; p.leader {
						l.flight.finish(hs[p.i], keys[p.i], p.c, *new(V), err, false)
					}
				}
			})
			retry := err != nil && ctx.Err() != nil
			for j := range todo {
				p := &todo[j]
				if !p.leader {
					continue
				}
				val, verr := found[keys[p.i]], err
				if verr == nil {
					if _, ok := found[keys[p.i]]; !ok {
						verr = ErrNotFound
					}
				}
				l.flight.finish(hs[p.i], keys[p.i], p.c, val, verr, retry)
				answer(p, val, verr)
			}
		}
		for j := range todo {
			p := &todo[j]
			if p.leader {
				continue
			}
			val, err, retry := l.flight.wait(ctx, p.c)
			if !retry {
				answer(p, val, err)
			}
			// A call whose leader left is looked up again below.
		}
	}
	for j := range todo {
		p := &todo[j]
		if !p.done {
			val, err := l.flight.do(ctx, hs[p.i], keys[p.i], l.load)
			answer(p, val, err)
		}
	}
	for i, k := range keys {
		if j := first[k]; j >= 0 && todo[j].i != i {
			vals[i], errs[i] = vals[todo[j].i], errs[todo[j].i]
		} else if j < 0 && errs[i] == nil {
			errs[i] = ErrNotFound // a repeat of a key the guard answered
		}
	}
	return vals, errs
}

// loadMany is one call of the batch lookup, bounded by WithLoadTimeout.
func (l *Loader[K, V]) loadMany(ctx context.Context, batch func(context.Context, []K) (map[K]V, error), keys []K) (map[K]V, error) {
	ctx, cancel := l.bound(ctx)
	defer cancel()
	l.storeCalls.Inc()
	l.batchCalls.Inc()
	found, err := batch(ctx, keys)
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, errors.New("guarded: the batch lookup returned a nil map and no error")
	}
	return found, nil
}

// notFound reports whether err from the store says the key is absent:
// ErrNotFound, or what WithNotFound recognizes.
func (l *Loader[K, V]) notFound(err error) bool {
	return errors.Is(err, ErrNotFound) || l.cfg.isNotFound(err)
}
