package compare

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sizes are the filter sizes compared; each n is a power of two, so that
// keys are indexed with i&(n-1). -short keeps the smallest only, and
// CUCKOOGUARD_BENCH_128M=1 adds 2^27 keys (about 5 GB of keys and
// filters: for a machine with the memory).
var sizes = func() []struct {
	name string
	n    int
} {
	s := []struct {
		name string
		n    int
	}{{"1M", 1 << 20}, {"16M", 1 << 24}}
	if os.Getenv("CUCKOOGUARD_BENCH_128M") != "" {
		s = append(s, struct {
			name string
			n    int
		}{"128M", 1 << 27})
	}
	return s
}()

// fprSamples is how many absent keys a filter's false-positive rate is
// measured on.
const fprSamples = 1_000_000

// sink keeps benchmark results alive.
var sink int

var (
	keysMu  sync.Mutex
	keysByN = map[int]*Keys{}
)

// keysFor returns the key set of n, made once per process.
func keysFor(n int) *Keys {
	keysMu.Lock()
	defer keysMu.Unlock()
	k, ok := keysByN[n]
	if !ok {
		k = NewKeys(n)
		keysByN[n] = k
	}
	return k
}

// built is a filter holding the n present keys, made once per process and
// shared by the benchmarks of one filter and size. Benchmarks that change
// it put back the keys they took out before returning.
type built struct {
	f    Filter
	bits float64 // bits/item, measured holding n keys
	fpr  float64 // measured on fprSamples absent keys

	// Where BenchmarkRemove goes on with the next call.
	removeAt int
}

var (
	builtMu sync.Mutex
	builtBy = map[string]*built{}
)

// prebuilt returns the filter of im filled with the n present keys. It
// fails b if the filter refuses a key or then misses one.
func prebuilt(b *testing.B, im Impl, n int) *built {
	b.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	id := fmt.Sprintf("%s/%d", im.Name, n)
	if p, ok := builtBy[id]; ok {
		return p
	}
	keys := keysFor(n)
	f := im.New(n)
	if err := Fill(f, keys); err != nil {
		b.Fatalf("%s n=%d: %v", im.Name, n, err)
	}
	if miss := FalseNegatives(f, keys); miss > 0 {
		b.Fatalf("%s n=%d: %d false negatives of %d keys", im.Name, n, miss, n)
	}
	p := &built{f: f, bits: im.BitsPerItem(f, n), fpr: MeasureFPR(f, keys, fprSamples)}
	builtBy[id] = p
	return p
}

// report adds the filter's memory and false-positive rate to b's results.
func report(b *testing.B, p *built) {
	b.ReportMetric(p.bits, "bits/item")
	b.ReportMetric(p.fpr, "fpr")
}

// eachFilter runs bench as sub-benchmarks n=…/filter=….
func eachFilter(b *testing.B, bench func(b *testing.B, im Impl, n int)) {
	for _, sz := range sizes {
		if testing.Short() && sz.n > 1<<20 {
			continue
		}
		b.Run("n="+sz.name, func(b *testing.B) {
			for _, im := range Impls {
				b.Run("filter="+im.Name, func(b *testing.B) { bench(b, im, sz.n) })
			}
		})
	}
}

// BenchmarkContains measures serial lookups in a filter holding n keys:
// hit=0% looks up absent keys, hit=100% present ones.
func BenchmarkContains(b *testing.B) {
	eachFilter(b, func(b *testing.B, im Impl, n int) {
		for _, hit := range []int{0, 100} {
			b.Run(fmt.Sprintf("hit=%d%%", hit), func(b *testing.B) {
				keys := keysFor(n)
				p := prebuilt(b, im, n)
				f, mask := p.f, keys.N-1
				set := keys.absent
				if hit == 100 {
					set = keys.present
				}
				b.ReportAllocs()
				found, ops := 0, 0
				for b.Loop() {
					j := (ops & mask) * KeySize
					if f.Contains(set[j : j+KeySize : j+KeySize]) {
						found++
					}
					ops++
				}
				sink = found
				if hit == 100 && found != ops {
					b.Fatalf("%d false negatives in %d lookups", ops-found, ops)
				}
				report(b, p)
			})
		}
	})
}

// addChunk is the grain at which BenchmarkAdd spreads its timed inserts
// over a fill.
const addChunk = 1 << 10

// BenchmarkAdd measures serial inserts into a filter sized for n, from
// empty to n keys. Each fill starts from a new filter made with the timer
// stopped. A fill of which fewer than n inserts are left to time (b.N < n,
// or the last part of b.N) times that many inserts spread evenly over the
// whole fill, the others being done with the timer stopped, so that ns/op
// is always the average over loads from 0 to n, whatever b.N is.
func BenchmarkAdd(b *testing.B) {
	eachFilter(b, func(b *testing.B, im Impl, n int) {
		keys := keysFor(n)
		p := prebuilt(b, im, n)
		refused := 0
		b.ReportAllocs()
		b.ResetTimer()
		b.StopTimer()
		for done := 0; done < b.N; {
			f := im.New(n)
			r := min(b.N-done, n) // inserts of this fill to time
			if r == n {
				b.StartTimer()
				for j := range n {
					if !f.Add(keys.Present(j)) {
						refused++
					}
				}
				b.StopTimer()
			} else {
				// Chunk c times the first timedBy(c+1)-timedBy(c) of its
				// inserts, with timedBy(c) = c·addChunk·r/n.
				for c := 0; c < n/addChunk; c++ {
					lo := c * addChunk
					t := (lo+addChunk)*r/n - lo*r/n
					if t > 0 {
						b.StartTimer()
						for j := lo; j < lo+t; j++ {
							if !f.Add(keys.Present(j)) {
								refused++
							}
						}
						b.StopTimer()
					}
					for j := lo + t; j < lo+addChunk; j++ {
						if !f.Add(keys.Present(j)) {
							refused++
						}
					}
				}
			}
			done += r
		}
		if refused > 0 {
			b.Fatalf("%d adds refused", refused)
		}
		report(b, p)
	})
}

// removeBatch is how many keys BenchmarkRemove removes between two
// re-adds with the timer stopped.
const removeBatch = 1 << 14

// BenchmarkRemove measures serial removes of present keys from a filter
// holding n keys: it removes a batch of keys, adds them back with the
// timer stopped, and goes on with the next batch, so the filter stays
// within removeBatch keys of n.
func BenchmarkRemove(b *testing.B) {
	eachFilter(b, func(b *testing.B, im Impl, n int) {
		if !im.CanRemove {
			b.Skipf("%s cannot remove", im.Name)
		}
		keys := keysFor(n)
		p := prebuilt(b, im, n)
		f, mask := p.f, n-1
		misses, refused := 0, 0
		b.ReportAllocs()
		b.ResetTimer()
		for done := 0; done < b.N; {
			m := min(removeBatch, b.N-done)
			for t := range m {
				if !f.Remove(keys.Present((p.removeAt + t) & mask)) {
					misses++
				}
			}
			b.StopTimer()
			for t := range m {
				if !f.Add(keys.Present((p.removeAt + t) & mask)) {
					refused++
				}
			}
			p.removeAt = (p.removeAt + m) & mask
			done += m
			b.StartTimer()
		}
		b.StopTimer()
		if misses > 0 || refused > 0 {
			b.Fatalf("%d removes of present keys found nothing, %d re-adds refused", misses, refused)
		}
		report(b, p)
	})
}

// BenchmarkMixParallel runs MixRandom on b.RunParallel: 95 % lookups
// (half present, half absent keys) and 5 % churn, writes that add fresh
// keys and remove them again 64 writes later, so that the size stays put.
// See runMix for how each filter runs it. Run with -cpu=1,2,4,8,16 for
// the scaling.
func BenchmarkMixParallel(b *testing.B) {
	eachFilter(b, func(b *testing.B, im Impl, n int) { runMix(b, im, n, MixRandom) })
}

// BenchmarkMixRing runs issue 34's 95/5 mix, MixRing, on b.RunParallel
// (writes=5%), and its lookups alone (writes=0%), so that one run shows
// what the writes cost the lookups. Each goroutine's writes are spread
// evenly and cycle through its own ring of 4,096 keys; with -cpu=N,
// GOMAXPROCS and the goroutine count are both N. See runMix for how each
// filter runs it.
func BenchmarkMixRing(b *testing.B) {
	eachFilter(b, func(b *testing.B, im Impl, n int) {
		for _, c := range []struct {
			name string
			m    Mix
		}{{"writes=0%", MixReadOnly}, {"writes=5%", MixRing}} {
			b.Run(c.name, func(b *testing.B) { runMix(b, im, n, c.m) })
		}
	})
}

// handoffProbe is how long runMix measures Handoff before and after a
// parallel run.
const handoffProbe = 20 * time.Millisecond

// runMix runs mix m with MixWorker on b.RunParallel on the filter of im
// prebuilt with n keys. The guard, blobloom and panmari256 are used as
// they are; every other peer sits behind one sync.RWMutex. Bloom filters
// cannot remove: their writes are all adds, on a copy of the prebuilt
// filter made for each call (timer stopped). For the guard it also
// reports read retries per 1,000 lookups: lookups whose miss overlapped a
// move and were repeated. With GOMAXPROCS above 1 it reports the
// machine's Handoff just before and just after the run: a run whose two
// figures differ much ran on a machine that changed under it.
func runMix(b *testing.B, im Impl, n int, m Mix) {
	keys := keysFor(n)
	p := prebuilt(b, im, n)
	f := p.f
	if !im.CanRemove && m.WriteEvery > 0 {
		f = copyForAdds(b, im, f, keys)
	}
	if !im.Concurrent {
		f = NewLocked(f)
	}
	retries0 := guardRetries(p.f)
	var ids atomic.Uint64
	var res MixResult
	before := Handoff(handoffProbe)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		MixWorker(f, keys, m, ids.Add(1), im.CanRemove, pb, &res)
	})
	b.StopTimer()
	if before > 0 {
		b.ReportMetric(before, "handoff-before-ns")
		b.ReportMetric(Handoff(handoffProbe), "handoff-after-ns")
	}
	sink = int(res.Hits.Load())
	if fn, rf, rm := res.FalseNegatives.Load(), res.Refused.Load(), res.RemoveMisses.Load(); fn+rf+rm > 0 {
		b.Fatalf("%d false negatives, %d adds refused, %d removes missed", fn, rf, rm)
	}
	if _, ok := p.f.(guardFilter); ok {
		lookups := float64(res.Ops.Load()) * m.LookupShare()
		b.ReportMetric(1000*float64(guardRetries(p.f)-retries0)/lookups, "retries/1k-lookups")
	}
	report(b, p)
}

// copyForAdds returns a filter holding keys' present keys, for the adds
// of a filter that cannot remove: bloom copies the prebuilt one, others
// are filled anew. The timer is stopped meanwhile.
func copyForAdds(b *testing.B, im Impl, f Filter, keys *Keys) Filter {
	b.StopTimer()
	defer b.StartTimer()
	if bf, ok := f.(bloomFilter); ok {
		return bloomFilter{bf.f.Copy()}
	}
	c := im.New(keys.N)
	if err := Fill(c, keys); err != nil {
		b.Fatal(err)
	}
	return c
}

// guardRetries returns the guard's read retries so far, 0 for a peer.
func guardRetries(f Filter) uint64 {
	if g, ok := f.(guardFilter); ok {
		return g.g.Stats().ReadRetries
	}
	return 0
}

// BenchmarkAddParallel measures adds of fresh keys on b.RunParallel into a
// copy of a filter prebuilt with n keys: insert-only throughput. Only the
// filters that take any number of adds run it: the guard (it doubles as
// it fills) and the Bloom filters (their rate of false positives rises);
// the fixed-size cuckoo peers would refuse adds past their capacity.
func BenchmarkAddParallel(b *testing.B) {
	eachFilter(b, func(b *testing.B, im Impl, n int) {
		if im.CanRemove && im.Name != "guard" {
			b.Skip("a fixed-size cuckoo filter refuses adds past its capacity")
		}
		keys := keysFor(n)
		f := copyForAdds(b, im, nil, keys)
		if !im.Concurrent {
			f = NewLocked(f)
		}
		var ids atomic.Uint64
		var refused atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			id := ids.Add(1)
			var k [KeySize]byte
			c := uint64(FreshBase) + id<<32
			r := int64(0)
			for pb.Next() {
				PutKey(k[:], c)
				c++
				if !f.Add(k[:]) {
					r++
				}
			}
			refused.Add(r)
		})
		b.StopTimer()
		if r := refused.Load(); r > 0 {
			b.Fatalf("%d adds refused", r)
		}
	})
}

// BenchmarkMixFloor is about the least that MixRing's writes can cost
// concurrent lookups at 1M keys, whatever the filter: a 2 MiB table (the
// size of the guard with 1M keys) with no filter in it, where a lookup is
// two loads at random places and every 20th operation (writes=5%) is one
// atomic store at a random place, with no count and no hashing. Every
// line a write changes is one the other cores' lookups read (the table
// fits in their caches), so a write takes the line from their caches and
// the next of them to read it misses. locked=1 takes one of 64 mutexes
// around each store, as a filter whose writers lock a shard would. What a
// write adds per goroutine over writes=0%, divided by the handoff, is how
// many handoffs a write costs; compare MixRing's guard with it at the same
// -cpu and the same handoff.
func BenchmarkMixFloor(b *testing.B) {
	const words = 1 << 18 // 2 MiB
	const locks = 64
	for _, c := range []struct {
		name   string
		every  int
		locked bool
	}{{"writes=0%", 0, false}, {"writes=5%/locked=0", 20, false}, {"writes=5%/locked=1", 20, true}} {
		b.Run(c.name, func(b *testing.B) {
			t := make([]atomic.Uint64, words)
			mu := make([]struct {
				sync.Mutex
				_ [64 - 8]byte // a line each
			}, locks)
			var ids atomic.Uint64
			var total atomic.Uint64
			before := Handoff(handoffProbe)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rng := (ids.Add(1) * 0x9e3779b97f4a7c15) | 1
				untilWrite := c.every
				var s uint64
				for pb.Next() {
					rng ^= rng << 13 // xorshift64
					rng ^= rng >> 7
					rng ^= rng << 17
					i := rng & (words - 1)
					if untilWrite--; untilWrite == 0 {
						untilWrite = c.every
						if c.locked {
							m := &mu[i%locks]
							m.Lock()
							t[i].Store(rng)
							m.Unlock()
						} else {
							t[i].Store(rng)
						}
						continue
					}
					s += t[i].Load() + t[(rng>>32)&(words-1)].Load()
				}
				total.Add(s)
			})
			b.StopTimer()
			if before > 0 {
				b.ReportMetric(before, "handoff-before-ns")
				b.ReportMetric(Handoff(handoffProbe), "handoff-after-ns")
			}
			sink = int(total.Load())
		})
	}
}
