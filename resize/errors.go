package resize

import "errors"

// ErrMaxBytes is returned by [Resizer.GrowNow] when the doubling would make
// the memory in use pass the cap set with [WithMaxBytes].
var ErrMaxBytes = errors.New("resize: memory cap reached")

// ErrSaturated is returned by [Resizer.GrowNow] when the shard has no tail
// bits left to split (it wraps [shard.ErrSaturated]).
var ErrSaturated = errors.New("resize: shard saturated")
