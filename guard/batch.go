package guard

import (
	"github.com/zeebo/xxh3"

	"github.com/cuckooguard/cuckooguard/shard"
)

// batchMin is the fewest keys that a batch lookup runs through a
// shard.Batch: below it, a lookup per key costs less than the Batch's
// few KiB of state, which Go zeroes on every call.
const batchMin = 4

// ContainsMany sets out[i] to [Guard.Contains](keys[i]) for every key: if
// false, keys[i] is definitely not in the set; if true, it might be (a
// false positive). It gives the same answers as one Contains per key,
// under the same guarantees, but requests the buckets of many keys before
// it compares any, so that their cache misses overlap each other and the
// hashing of the next keys (see [shard.Batch]): at large sizes, where a
// lookup waits for memory, it is several times faster per key. It takes no
// lock and does not allocate. out must be at least as long as keys
// (ContainsMany panics otherwise, as an index out of range would).
func (g *Guard) ContainsMany(keys [][]byte, out []bool) {
	if len(keys) < batchMin {
		for i, k := range keys {
			out[i] = g.Contains(k)
		}
		return
	}
	var b shard.Batch
	b.Start(out[:len(keys)])
	for _, k := range keys {
		s, f, v := g.route(xxh3.HashSeed(k, g.seed))
		b.Add(s, f, v)
	}
	b.Finish()
}

// ContainsManyStrings is [Guard.ContainsMany] for string keys, without
// copying them.
func (g *Guard) ContainsManyStrings(keys []string, out []bool) {
	if len(keys) < batchMin {
		for i, k := range keys {
			out[i] = g.ContainsString(k)
		}
		return
	}
	var b shard.Batch
	b.Start(out[:len(keys)])
	for _, k := range keys {
		s, f, v := g.route(xxh3.HashStringSeed(k, g.seed))
		b.Add(s, f, v)
	}
	b.Finish()
}

// ContainsManyHashes is [Guard.ContainsMany] for keys hashed by the caller
// (see the hash layout in the package documentation).
func (g *Guard) ContainsManyHashes(hashes []uint64, out []bool) {
	if len(hashes) < batchMin {
		for i, h := range hashes {
			out[i] = g.ContainsHash(h)
		}
		return
	}
	var b shard.Batch
	b.Start(out[:len(hashes)])
	for _, h := range hashes {
		b.Add(g.route(h))
	}
	b.Finish()
}
