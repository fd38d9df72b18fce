package guarded

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
)

// flight coalesces concurrent store lookups of one key, as
// golang.org/x/sync/singleflight does, typed and without a goroutine per
// call:
//
//   - The first caller of a key (the leader) runs the lookup in its own
//     goroutine, under its own ctx. Later callers of the key wait for its
//     result or for their own ctx, whichever comes first.
//   - If the leader's ctx ends and the lookup fails, the waiters do not
//     inherit that failure: they start over, and one of them leads a new
//     lookup. A caller that leaves therefore cancels the store's work
//     unless others still want it, and never fails them.
//   - A call that no waiter joined is recycled, so an uncontended lookup
//     allocates nothing; a waiter costs one channel.
//   - A batch (Loader.GetMany) leads the calls of many keys at once with
//     begin and finish, and waits for the calls it joined with wait.
//   - A lookup that panics, or calls runtime.Goexit, still finishes its
//     call (see protect): its waiters get an error that says so, the key
//     is free for the next caller, and the panic goes on in the leader's
//     goroutine, as golang.org/x/sync/singleflight does.
//
// The calls in flight live in a striped map by key hash; a stripe's mutex
// also protects the waiters and done fields of its calls.
type flight[K comparable, V any] struct {
	calls striped[K, *call[V]]
	pool  sync.Pool // of *call[V]
}

// call is one lookup in flight. val, err and retry are written by the
// leader before done is closed (or, with no waiters, before the leader
// reads them itself) and read by waiters after it.
type call[V any] struct {
	waiters int           // callers waiting besides the leader; under the stripe's mu
	done    chan struct{} // made by the first waiter; closed by the leader
	val     V
	err     error
	retry   bool // the leader's ctx ended the lookup: waiters start over
}

// do returns the result of lookup(ctx, key), sharing one call among
// concurrent callers of the same key. h picks the stripe.
func (f *flight[K, V]) do(ctx context.Context, h uint64, key K, lookup func(context.Context, K) (V, error)) (V, error) {
	for {
		c, leader := f.begin(h, key)
		if !leader {
			val, err, retry := f.wait(ctx, c)
			if retry {
				continue
			}
			return val, err
		}
		var val V
		var err error
		protect(func() { val, err = lookup(ctx, key) }, func(err error) {
			f.finish(h, key, c, *new(V), err, false)
		})
		f.finish(h, key, c, val, err, err != nil && ctx.Err() != nil)
		return val, err
	}
}

// panicError is a panic of a store lookup, with the stack where it
// happened: the waiters of the lookup get it as their error, and the
// leader panics with it, so that the stack survives the recover in
// between.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string {
	return fmt.Sprintf("guarded: the store lookup panicked: %v\n\n%s", p.value, p.stack)
}

// Unwrap returns the panic's value if it is an error.
func (p *panicError) Unwrap() error {
	err, _ := p.value.(error)
	return err
}

// protect calls fn. If fn panics or calls runtime.Goexit, protect first
// calls abort with an error that says so (a *panicError, or errGoexit) and
// then lets the Goexit go on, or panics with the *panicError. A Goexit
// leaves nothing to recover, which tells the two apart: since Go 1.21
// panic(nil) panics with a *runtime.PanicNilError.
func protect(fn func(), abort func(error)) {
	normal := false
	defer func() {
		if normal {
			return
		}
		r := recover()
		if r == nil { // runtime.Goexit: it goes on once the deferred calls are done
			abort(errGoexit)
			return
		}
		pe := &panicError{value: r, stack: debug.Stack()}
		abort(pe)
		panic(pe)
	}()
	fn()
	normal = true
}

// begin returns the call in flight for key and false, or, if there is
// none, a new call that the caller leads and must finish, and true.
func (f *flight[K, V]) begin(h uint64, key K) (*call[V], bool) {
	st := f.calls.of(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	if c, ok := st.m[key]; ok {
		c.waiters++
		if c.done == nil {
			c.done = make(chan struct{})
		}
		return c, false
	}
	c, _ := f.pool.Get().(*call[V])
	if c == nil {
		c = new(call[V])
	}
	st.put(key, c)
	return c, true
}

// finish ends call c of key, which the caller led, with its result: the
// waiters get it, or start over if retry (the leader's ctx ended the
// lookup, which says nothing about the key). c must not be used after.
func (f *flight[K, V]) finish(h uint64, key K, c *call[V], val V, err error, retry bool) {
	st := f.calls.of(h)
	st.mu.Lock()
	if st.m[key] == c { // forget may have removed it already
		delete(st.m, key)
	}
	shared := c.waiters > 0
	if shared {
		c.val, c.err, c.retry = val, err, retry
		close(c.done)
	}
	st.mu.Unlock()
	if !shared {
		// Nobody else saw c: reuse it.
		*c = call[V]{}
		f.pool.Put(c)
	}
}

// wait waits for call c, which the caller joined, or for ctx. retry is true
// if the call's leader left and the caller should begin again.
func (f *flight[K, V]) wait(ctx context.Context, c *call[V]) (val V, err error, retry bool) {
	select {
	case <-c.done:
	case <-ctx.Done():
		return val, ctx.Err(), false
	}
	if c.retry {
		if err := ctx.Err(); err != nil {
			return val, err, false
		}
		return val, nil, true
	}
	return c.val, c.err, false
}

// forget makes the next caller of key start a new lookup, even while one
// is in flight: a write to key means a lookup that began before it may
// have missed it.
func (f *flight[K, V]) forget(h uint64, key K) {
	st := f.calls.of(h)
	st.mu.Lock()
	delete(st.m, key)
	st.mu.Unlock()
}
