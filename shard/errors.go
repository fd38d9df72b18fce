package shard

import (
	"errors"
	"fmt"
)

// ErrFull is returned, possibly wrapped, by [Shard.Insert] when the item
// cannot be placed: both candidate buckets are full, the search for an
// eviction path found none that ends in a free slot, the stash is full,
// and the shard cannot double. The search moves nothing, so every item
// stored before the call is still where it was. Test for it with
// [errors.Is].
//
// A shard without a growth policy never doubles by itself: growing it
// with [Shard.Grow] makes room. A shard with one ([Shard.SetGrowth])
// doubles before it gives up, and the error says why it could not: the
// memory cap, a crowd of colliding items (the shard is less than
// [MinGrowLoad] full: a doubling would not separate them), or a table that
// uses every position bit. Once a search has failed, an insert that would
// need one fails at once until an item is deleted or the shard doubles,
// so that writers retrying on a full shard do not search it again and
// again.
var ErrFull = errors.New("shard: full")

// The reasons a shard with a growth policy could not double.
var (
	errFullMaxBytes  = fmt.Errorf("%w: memory cap reached", ErrFull)
	errFullCrowded   = fmt.Errorf("%w: items that collide crowd this item's buckets (doubling would not separate them)", ErrFull)
	errFullSaturated = fmt.Errorf("%w: the table uses every position bit and cannot double", ErrFull)
)

// ErrTooManyCopies is returned by [Shard.Insert] for an item of which the
// shard holds [MaxCopies] identical copies already. The item is present;
// the shard is unchanged. Doubling would not help (every copy of an item
// moves to the same bucket), so callers must not double on it.
var ErrTooManyCopies = errors.New("shard: too many copies of one item")

// ErrSaturated is returned by [Shard.Grow] when the shard's table has
// 2^VirtualBits buckets (on a 32-bit platform, 2^27: 1 GiB) and cannot
// double again.
var ErrSaturated = errors.New("shard: saturated: the table uses every position bit")

// ErrZeroFingerprint is returned by [Shard.Insert] for the fingerprint 0,
// which no lookup may match (see the package documentation).
var ErrZeroFingerprint = errors.New("shard: fingerprint must not be 0")

// ErrCorrupt is returned by [Shard.ReadFrom] for an encoding that is not a
// valid shard. The error wraps it with what was wrong.
var ErrCorrupt = errors.New("shard: corrupt encoding")
