package resize

import "errors"

// ErrMaxBytes is returned by [Resizer.GrowNow] when the doubling would make
// the memory in use pass the cap set with [WithMaxBytes].
var ErrMaxBytes = errors.New("resize: memory cap reached")

// ErrCrowded is returned by [Resizer.GrowNow] for a shard that is less
// than MinGrowLoad full: an insert that failed there failed because items
// that agree on every bit the shard compares crowd its two buckets, and a
// doubling would not separate them. Doubling anyway would let such items
// grow the shard without bound.
var ErrCrowded = errors.New("resize: shard not full: colliding items crowd two buckets")
