package shard

import "errors"

// ErrFull is returned by [Shard.Insert] when the item cannot be placed: both
// candidate buckets are full, the eviction walk of [MaxKicks] steps found no
// free slot and the stash is full. The walk is rolled back, so every item
// stored before the call is still present. Growing the shard with
// [Shard.Grow] makes room. Once a walk has failed, an insert that would
// need one fails at once until an item is deleted or the shard doubles, so
// that writers retrying on a full shard do not keep lookups retrying.
var ErrFull = errors.New("shard: full")

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
