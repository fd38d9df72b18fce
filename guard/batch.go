package guard

import (
	"github.com/zeebo/xxh3"

	"github.com/cuckooguard/cuckooguard/shard"
)

// ContainsMany sets out[i] to [Guard.Contains](keys[i]) for every key: if
// false, keys[i] is definitely not in the set; if true, it might be (a
// false positive). It gives the same answers as one Contains per key,
// under the same guarantees, but loads the buckets of many keys before it
// compares any, so that their cache misses overlap: at large sizes, where
// a lookup waits for memory, it is several times faster per key. It takes
// no lock and does not allocate. out must be at least as long as keys
// (ContainsMany panics otherwise, as an index out of range would).
func (g *Guard) ContainsMany(keys [][]byte, out []bool) {
	out = out[:len(keys)]
	var hs [shard.BatchGroup]uint64
	for base := 0; base < len(keys); base += len(hs) {
		group := keys[base:min(base+len(hs), len(keys))]
		for i, k := range group {
			hs[i] = xxh3.HashSeed(k, g.seed)
		}
		g.containsGroup(hs[:len(group)], out[base:])
	}
}

// ContainsManyStrings is [Guard.ContainsMany] for string keys, without
// copying them.
func (g *Guard) ContainsManyStrings(keys []string, out []bool) {
	out = out[:len(keys)]
	var hs [shard.BatchGroup]uint64
	for base := 0; base < len(keys); base += len(hs) {
		group := keys[base:min(base+len(hs), len(keys))]
		for i, k := range group {
			hs[i] = xxh3.HashStringSeed(k, g.seed)
		}
		g.containsGroup(hs[:len(group)], out[base:])
	}
}

// ContainsManyHashes is [Guard.ContainsMany] for keys hashed by the caller
// (see the hash layout in the package documentation).
func (g *Guard) ContainsManyHashes(hashes []uint64, out []bool) {
	out = out[:len(hashes)]
	for base := 0; base < len(hashes); base += shard.BatchGroup {
		g.containsGroup(hashes[base:min(base+shard.BatchGroup, len(hashes))], out[base:])
	}
}

// containsGroup looks up at most shard.BatchGroup hashes into out.
func (g *Guard) containsGroup(hs []uint64, out []bool) {
	var ss [shard.BatchGroup]*shard.Shard
	var fs [shard.BatchGroup]uint8
	for i, h := range hs {
		ss[i], fs[i], _ = g.route(h)
	}
	shard.ContainsMany(ss[:len(hs)], fs[:len(hs)], hs, out)
}
