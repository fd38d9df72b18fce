package guarded

import (
	"math"
	"sync/atomic"
	"time"
)

// readiness is a Loader's readiness: not ready, ready until it is
// invalidated, or ready until a moment on the monotonic clock (a lease,
// [Feed.ReadyUntil]; the package doc says what it assumes of the clock).
type readiness struct {
	until atomic.Int64 // notReady, forever, or nanoseconds after born
	born  time.Time    // the clock's origin: a monotonic reading
}

const (
	notReady int64 = 0
	forever  int64 = math.MaxInt64
)

// load returns the state, to be judged later with holds: a lookup loads it
// before it reads the guard, and compares it with the clock only for an
// answer "absent". Whatever the guard held when a lease was granted, it
// holds when the lease is loaded after that.
func (r *readiness) load() int64 { return r.until.Load() }

// holds reports whether until, a state load returned, makes the Loader
// ready now.
func (r *readiness) holds(until int64) bool {
	return until == forever || (until != notReady && int64(time.Since(r.born)) < until)
}

// ready reports whether the Loader is ready now.
func (r *readiness) ready() bool { return r.holds(r.load()) }

// set makes the Loader ready (true, without a lease) or not.
func (r *readiness) set(ready bool) {
	if ready {
		r.until.Store(forever)
	} else {
		r.until.Store(notReady)
	}
}

// lease makes the Loader ready until t. A moment at or before born is a
// lease that has lapsed already.
func (r *readiness) lease(t time.Time) {
	r.until.Store(max(int64(t.Sub(r.born)), 1))
}
