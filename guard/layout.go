package guard

import (
	"math"

	"github.com/cuckooguard/cuckooguard/shard"
)

// routeBits is the number of top hash bits that pick a shard.
const routeBits = 64 - shard.FingerprintBits - shard.VirtualBits

// maxMixedShards bounds the shard count of a mixed layout, whose routing
// scans the shard boundaries.
const maxMixedShards = 8

// layout says how many shards a guard has, how big each is and which share
// of the hash space routes to each.
//
// A uniform layout has equal shards and routes the top routeBits bits x of
// a hash by multiply-shift: shard (x·n) >> routeBits, which works for any
// n. Large guards use it. A mixed layout, for small guards, has up to
// maxMixedShards shards of different power-of-two sizes; shard i gets the
// routing values below bounds[i] and above the previous bound, a share in
// proportion to the number of keys it can hold below the grow threshold.
// Either way the total table size need not be a power of two.
type layout struct {
	logs   []int    // log2 buckets of each shard
	bounds []uint32 // mixed layouts: exclusive upper routing bound of each shard; nil if uniform
}

// shardIndex returns the shard that routing value x (< 2^routeBits) maps to.
func (l *layout) shardIndex(x uint64) uint64 {
	if l.bounds == nil {
		return x * uint64(len(l.logs)) >> routeBits
	}
	i := 0
	for i < len(l.bounds)-1 && x >= uint64(l.bounds[i]) {
		i++
	}
	return uint64(i)
}

// share returns the fraction of keys that shard i receives.
func (l *layout) share(i int) float64 {
	if l.bounds == nil {
		return 1 / float64(len(l.logs))
	}
	lo := uint32(0)
	if i > 0 {
		lo = l.bounds[i-1]
	}
	return float64(l.bounds[i]-lo) / (1 << routeBits)
}

// bytes returns the memory the layout's shards take, at most math.MaxInt
// (a 32-bit int overflows for large layouts).
func (l *layout) bytes() int {
	var n int64
	for _, k := range l.logs {
		n += int64(shard.BytesFor(k))
		if n > math.MaxInt {
			return math.MaxInt
		}
	}
	return int(n)
}

// reserved returns the memory a memory cap must hold for the layout's
// shards: bytes with room for a full stash in each (see
// shard.ReserveFor), at most math.MaxInt.
func (l *layout) reserved() int {
	var n int64
	for _, k := range l.logs {
		n += int64(shard.ReserveFor(k))
		if n > math.MaxInt {
			return math.MaxInt
		}
	}
	return int(n)
}
