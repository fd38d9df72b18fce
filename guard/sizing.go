package guard

import (
	"fmt"
	"math"
	"math/bits"
	"runtime"

	"github.com/cuckooguard/cuckooguard/shard"
)

// MaxCapacity bounds WithCapacity: 2^40 keys would take about 2.5 TB.
const MaxCapacity = min(1<<40, math.MaxInt)

// sizingSigmas is how many standard deviations above its mean a shard's key
// count may be, at the declared capacity, without reaching the grow
// threshold. Keys spread over shards binomially.
const sizingSigmas = 3

// maxItemsPerShard returns the largest mean key count m of a shard of
// 2^k buckets such that m + sizingSigmas·√m stays below threshold·slots.
func maxItemsPerShard(k int, threshold float64) float64 {
	a := threshold * float64(int64(4)<<k)
	z := float64(sizingSigmas)
	r := (-z + math.Sqrt(z*z+4*a)) / 2
	return r * r
}

// uniform returns the layout of n equal shards of 2^k buckets.
func uniform(n, k int) layout {
	logs := make([]int, n)
	for i := range logs {
		logs[i] = k
	}
	return layout{logs: logs}
}

// plan chooses the layout for capacity keys: the one that needs the least
// memory, counting each shard's fixed overhead, such that at the capacity
// every shard's key count stays below the grow threshold with
// sizingSigmas of margin. Shard tables must be powers of two (the XOR
// between a key's two buckets needs it), but the total need not be: plan
// tries equal shards of every size, in any number, and small mixes of
// different sizes. Among layouts within 1% of the least memory it prefers
// more shards, so that writers contend less.
//
// With shards > 0 the count is fixed and all shards are equal.
//
// A guard that starts small and grows keeps its shards (see
// concurrencyShards), so plan also wants at least minShards of them, as
// many as the memory budget of capacityBudget allows.
func plan(capacity, shards int, threshold float64, minShards int) (layout, error) {
	l, err := leanestPlan(capacity, shards, threshold)
	if err != nil || shards > 0 || len(l.logs) >= minShards {
		return l, err
	}
	// The budget is the guard's: what it holds besides its shards counts.
	budget := max(capacityBudget(capacity)-fixedBytes(l), l.bytes())
	c := float64(capacity)
	best := l
	// better reports whether u beats best: enough shards first, then the
	// least memory among layouts with enough, the most shards among those
	// without.
	better := func(u layout) bool {
		un, bn := min(len(u.logs), minShards), min(len(best.logs), minShards)
		if un != bn {
			return un > bn
		}
		return u.bytes() < best.bytes()
	}
	for k := 1; k <= shard.MaxLog2Buckets; k++ {
		need := int(math.Ceil(c / maxItemsPerShard(k, threshold)))
		n := min(max(need, minShards), MaxShards)
		for n >= need && n >= 1 {
			if u := uniform(n, k); u.bytes() <= budget {
				if better(u) {
					best = u
				}
				break
			}
			// Too much memory with n shards of 2^k: fewer shards, as
			// long as they hold the capacity.
			n = max(need, n/2)
			if n == need {
				if u := uniform(n, k); u.bytes() <= budget && better(u) {
					best = u
				}
				break
			}
		}
	}
	return best, nil
}

// concurrencyShards returns the shard count a guard wants for the cores it
// runs on: 4 per GOMAXPROCS, at most 256. Writers of different shards never
// wait for each other, and a shard that doubles makes only its own readers
// retry; a guard keeps its shards for life, so a small one that will grow
// needs them from the start.
func concurrencyShards() int {
	return min(4*runtime.GOMAXPROCS(0), 256)
}

// capacityBudget is the memory plan may spend on shards for concurrency: 20
// bits per key at the declared capacity, and at least 64 KiB for guards
// declared for fewer than 10,000 keys, whose tables are tiny beside the
// shards' fixed overhead.
func capacityBudget(capacity int) int {
	b := capacity * 20 / 8
	if capacity < 10_000 {
		b = max(b, 64<<10)
	}
	return b
}

// leanestPlan is plan without the concurrency target.
func leanestPlan(capacity, shards int, threshold float64) (layout, error) {
	c := float64(capacity)
	if shards > 0 {
		for k := 1; k <= shard.MaxLog2Buckets; k++ {
			if maxItemsPerShard(k, threshold) >= c/float64(shards) {
				return uniform(shards, k), nil
			}
		}
		return layout{}, fmt.Errorf("guard: capacity %d does not fit in %d shards", capacity, shards)
	}
	var uniforms, mixes []layout
	for k := 1; k <= shard.MaxLog2Buckets; k++ {
		n := max(int(math.Ceil(c/maxItemsPerShard(k, threshold))), 1)
		if n <= MaxShards {
			uniforms = append(uniforms, uniform(n, k))
		}
		if l, ok := mixed(c, k, threshold); ok {
			mixes = append(mixes, l)
		}
	}
	// Equal shards route with one multiply and spread writers best: use
	// them unless they waste memory (small guards, where a few shards'
	// power-of-two rounding is a large fraction).
	if l, ok := leanest(uniforms); ok && float64(l.bytes())*8 <= uniformBitsBudget*c {
		return l, nil
	}
	if l, ok := leanest(append(uniforms, mixes...)); ok {
		return l, nil
	}
	return layout{}, fmt.Errorf("guard: capacity %d is too large", capacity)
}

// uniformBitsBudget is the memory per key, in bits at the declared capacity,
// up to which plan takes equal shards over a leaner mixed layout.
const uniformBitsBudget = 19.5

// leanest returns the layout with the most shards among those within 1% of
// the least memory, and reports whether cands was nonempty.
func leanest(cands []layout) (layout, bool) {
	best := math.MaxInt
	for i := range cands {
		best = min(best, cands[i].bytes())
	}
	pick := -1
	for i := range cands {
		b := cands[i].bytes()
		if float64(b) > float64(best)*1.01 {
			continue
		}
		if pick < 0 || len(cands[i].logs) > len(cands[pick].logs) ||
			len(cands[i].logs) == len(cands[pick].logs) && b < cands[pick].bytes() {
			pick = i
		}
	}
	if pick < 0 {
		return layout{}, false
	}
	return cands[pick], true
}

// mixed returns the smallest layout whose shards are the binary
// decomposition of some unit count N in units of 2^k buckets (so shards of
// 2^(k+e) buckets for each set bit e of N), with at most maxMixedShards
// shards, that holds c keys, and reports whether there is one. Each shard
// gets a share of keys in proportion to what it can hold, so the small
// shards, whose key counts spread more, get less than their size's worth
// and no shard forces the others to a low load.
func mixed(c float64, k int, threshold float64) (layout, bool) {
	perUnit := threshold * float64(int64(4)<<k)
	n0 := max(uint64(c/perUnit), 1)
	for n := n0; n <= 2*n0+1; n++ {
		if bits.OnesCount64(n) > maxMixedShards || k+bits.Len64(n)-1 > shard.MaxLog2Buckets {
			continue
		}
		var logs []int
		var caps []float64
		total := 0.0
		for e := bits.Len64(n) - 1; e >= 0; e-- {
			if n>>e&1 != 0 {
				logs = append(logs, k+e)
				m := maxItemsPerShard(k+e, threshold)
				caps = append(caps, m)
				total += m
			}
		}
		if total < c {
			continue
		}
		if len(logs) == 1 {
			return layout{logs: logs}, true
		}
		bounds := make([]uint32, len(logs))
		acc := 0.0
		for i, m := range caps {
			acc += m
			bounds[i] = uint32(math.Round(acc / total * (1 << routeBits)))
		}
		bounds[len(bounds)-1] = 1 << routeBits
		return layout{logs: logs, bounds: bounds}, true
	}
	return layout{}, false
}

// capacityWithin returns the largest capacity, up to c.capacity, for which
// a guard configured by c fits in c.maxBytes (0 if none does).
func capacityWithin(c config) int {
	fits := func(n int) bool {
		l, err := leanestPlan(n, c.shards, c.growThreshold)
		return err == nil && fixedBytes(l)+l.reserved() <= c.maxBytes
	}
	lo, hi := 0, c.capacity // fits(lo) or lo == 0
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
