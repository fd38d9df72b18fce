// Package mono holds moments on the monotonic clock: a follower keeps the
// moment its Loader's lease ([guarded.Feed.ReadyUntil]) runs out in a
// [Deadline], so that the state it reports is judged when it is read, as
// the Loader's answers are.
package mono

import (
	"sync/atomic"
	"time"
)

// origin is the clock's origin: a reading of the monotonic clock.
var origin = time.Now()

// Deadline is a moment until which something holds. The zero Deadline
// holds never. A Deadline is safe for concurrent use by multiple
// goroutines. A Deadline must not be copied after first use.
type Deadline struct {
	until atomic.Int64 // nanoseconds after origin; 0: none
}

// Set makes d hold until t, which should come from [time.Now] (a
// monotonic reading); a t at or before the process began has passed.
func (d *Deadline) Set(t time.Time) { d.until.Store(max(int64(t.Sub(origin)), 1)) }

// Holds reports whether d holds at now.
func (d *Deadline) Holds(now time.Time) bool {
	u := d.until.Load()
	return u != 0 && int64(now.Sub(origin)) < u
}
