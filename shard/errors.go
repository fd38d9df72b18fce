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

// ErrSaturated is returned by [Shard.Grow] when the shard has no tail bits
// left: it has already doubled [InitialTailBits] times.
var ErrSaturated = errors.New("shard: saturated: no tail bits left to split")

// ErrZeroFingerprint is returned by [Shard.Insert] for the fingerprint 0,
// which marks an empty slot and so cannot be stored.
var ErrZeroFingerprint = errors.New("shard: fingerprint must not be 0")
