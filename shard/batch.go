package shard

import "runtime"

// A lookup in a large table waits for memory twice, once per bucket, and
// a loop of lookups waits once per lookup: each one's work keeps the CPU
// from running far enough ahead to start the next one's loads. A batch
// lookup makes two passes over a group of items: the first only computes
// each item's two buckets and loads them, a few instructions per item, so
// that the cache misses of the whole group are in flight at once; the
// second runs the usual lookup, whose buckets are then in the cache.

// BatchGroup is the number of items ContainsMany loads before it looks any
// up: as many misses in flight as the memory system takes, while the
// group's buckets still fit in L1. Measured at 16M keys on a 2-vCPU Xeon
// (BenchmarkContainsMany in the bench module, three runs each): 16 items
// 46-50 ns per key, 32 items 41-43, 64 items 41-42; one Contains per key
// 72-74. The first pass loads the buckets and keeps nothing else (keeping
// each item's probes for the second pass measured 52-57 ns): it must stay
// short for the loads to overlap.
const BatchGroup = 32

// ContainsMany sets out[i] to whether the item with fingerprint fs[i] and
// position vs[i] might be in shards[i], as [Shard.Contains] would, for
// every i < len(shards). fs, vs and out must be at least as long as
// shards. It takes no lock and does not allocate.
func ContainsMany(shards []*Shard, fs []uint8, vs []uint64, out []bool) {
	n := len(shards)
	fs, vs, out = fs[:n], vs[:n], out[:n] // one bounds check for all
	for base := 0; base < n; base += BatchGroup {
		end := min(base+BatchGroup, n)
		var x uint64
		for i := base; i < end; i++ {
			t := shards[i].tab.Load()
			v := vs[i]
			x ^= t.load(v>>(t.sh&63)) ^ t.load((v^alt(fs[i]))>>(t.sh&63))
		}
		// Keep the loads' sum alive, so that no compiler drops them,
		// without a store that concurrent batches would race on (a
		// package variable would also be a cache line every core writes).
		runtime.KeepAlive(x)
		for i := base; i < end; i++ {
			out[i] = shards[i].Contains(fs[i], vs[i])
		}
	}
}
