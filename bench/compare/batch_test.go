package compare

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/FastFilter/xorfilter"
	"github.com/zeebo/xxh3"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// The batch benchmarks: the guard's batch lookups against one lookup per
// key, the machine's memory floor under them, and the guard's share of a
// Loader's GetMany. They use the guard's public API only, so that this
// file builds against earlier versions of the core too, for old-and-new
// comparisons in one run (the README's batch paragraph has the commands).

// batchSizes are the guard sizes of the batch benchmarks: 1M and 16M keys,
// and 100M with CUCKOOGUARD_BENCH_100M=1 (about 1 GB in all: the guard's
// 260 MB and a lookup sequence of 512 MB). -short keeps 1M.
var batchSizes = func() []struct {
	name string
	n    int
} {
	s := []struct {
		name string
		n    int
	}{{"1M", 1 << 20}, {"16M", 1 << 24}}
	if os.Getenv("CUCKOOGUARD_BENCH_100M") != "" {
		s = append(s, struct {
			name string
			n    int
		}{"100M", 100_000_000})
	}
	return s
}()

// seqLen bounds the lookup sequence of a batch set: 16M lookups, far more
// buckets than any cache holds, whatever the guard's size.
const seqLen = 1 << 24

// batchSet is a guard holding n present keys and a sequence of lookups of
// which half, at random, are of present keys and half of absent ones. The
// keys' bytes lie in lookup order, so that only the guard's buckets are
// random reads.
type batchSet struct {
	n       int
	g       *guard.Guard
	seq     []string
	present []bool  // whether seq[i] was added
	thpMiB  float64 // the process's AnonHugePages after the fill
	rssMiB  float64 // the process's VmRSS after the fill, before the sequence
}

var (
	batchMu   sync.Mutex
	batchSet1 *batchSet // the last one made: one at a time, for memory
)

// batchSetFor returns the batch set of n, made once per process (the last
// one only is kept).
func batchSetFor(b *testing.B, n int) *batchSet {
	b.Helper()
	batchMu.Lock()
	defer batchMu.Unlock()
	if s := batchSet1; s != nil && s.n == n {
		return s
	}
	if batchSet1 != nil {
		batchSet1.g.Close()
		batchSet1 = nil
		runtime.GC()
	}
	g, err := guard.New(guard.WithCapacity(n), guard.WithSeed(1))
	if err != nil {
		b.Fatal(err)
	}
	// Fill on every core: 100M adds one by one take half a minute.
	workers := runtime.NumCPU()
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			var k [KeySize]byte
			for i := w; i < n; i += workers {
				PutKey(k[:], presentBase+uint64(i))
				if err := g.Add(k[:]); err != nil {
					errs[w] = fmt.Errorf("add of key %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	s := &batchSet{n: n, g: g, thpMiB: procMiB("/proc/self/smaps_rollup", "AnonHugePages:"), rssMiB: procMiB("/proc/self/status", "VmRSS:")}
	l := min(n, seqLen)
	buf := make([]byte, l*KeySize)
	s.seq, s.present = make([]string, l), make([]bool, l)
	r := rand.New(rand.NewPCG(uint64(n), 42))
	for i := range l {
		c, present := absentBase+r.Uint64N(uint64(n)), r.IntN(2) == 0
		if present {
			c -= absentBase - presentBase
		}
		k := buf[i*KeySize : (i+1)*KeySize]
		PutKey(k, c)
		s.seq[i], s.present[i] = unsafe.String(&k[0], KeySize), present
	}
	// No false negative in a sample of the sequence, either way.
	sample := min(l, 1<<20)
	out := make([]bool, sample)
	g.ContainsManyStrings(s.seq[:sample], out)
	for i, p := range s.present[:sample] {
		if p && (!out[i] || !g.ContainsString(s.seq[i])) {
			b.Fatalf("n=%d: present key %d reads absent", n, i)
		}
	}
	batchSet1 = s
	return s
}

// BenchmarkContainsMany measures lookups per key, one goroutine, in a
// guard of n keys, of a sequence of keys half present and half absent at
// random: one ContainsString per key (batch=1) and ContainsManyStrings over
// batches of 1000 keys, and, at 1M and 16M, the static BinaryFuse16 filter
// of FastFilter/xorfilter (built once from the present keys, one lookup
// per key: the fastest static peer). thp-MiB is the process's memory in
// transparent huge pages after the guard's fill (AnonHugePages, Linux),
// rss-MiB its resident memory then (VmRSS: the guard and the runtime,
// before the lookup sequence is made, in a process that runs one size),
// for what huge pages cost in memory. Sizes run in one process reuse the
// memory of the sizes before: run one size per process for these two.
func BenchmarkContainsMany(b *testing.B) {
	const batch = 1000
	for _, sz := range batchSizes {
		if testing.Short() && sz.n > 1<<20 {
			continue
		}
		b.Run("n="+sz.name, func(b *testing.B) {
			s := batchSetFor(b, sz.n)
			g, seq := s.g, s.seq
			report := func(b *testing.B) {
				b.ReportMetric(g.Stats().BitsPerItem, "bits/item")
				if s.thpMiB >= 0 {
					b.ReportMetric(s.thpMiB, "thp-MiB")
					b.ReportMetric(s.rssMiB, "rss-MiB")
				}
			}
			b.Run("hit=50%/filter=guard/batch=1", func(b *testing.B) {
				b.ReportAllocs()
				found, i := 0, 0
				for b.Loop() {
					if g.ContainsString(seq[i]) {
						found++
					}
					if i++; i == len(seq) {
						i = 0
					}
				}
				sink = found
				report(b)
			})
			b.Run(fmt.Sprintf("hit=50%%/filter=guard/batch=%d", batch), func(b *testing.B) {
				b.ReportAllocs()
				out := make([]bool, batch)
				found, done, i := 0, 0, 0
				for done < b.N {
					m := min(batch, b.N-done, len(seq)-i)
					g.ContainsManyStrings(seq[i:i+m], out)
					for _, o := range out[:m] {
						if o {
							found++
						}
					}
					done += m
					if i += m; i == len(seq) {
						i = 0
					}
				}
				sink = found
				report(b)
			})
			if sz.n > 1<<24 {
				return // a fuse filter of 100M keys takes GBs and minutes to build
			}
			b.Run("hit=50%/filter=binaryfuse16", func(b *testing.B) {
				fuse := prebuiltFuse(b, sz.n)
				found, i := 0, 0
				for b.Loop() {
					if fuse.Contains(xxh3.HashString(seq[i])) {
						found++
					}
					if i++; i == len(seq) {
						i = 0
					}
				}
				sink = found
			})
		})
	}
}

var (
	fuseMu sync.Mutex
	fuseBy = map[int]*xorfilter.BinaryFuse[uint16]{}
)

// prebuiltFuse returns the BinaryFuse16 filter of the n present keys, made
// once per process.
func prebuiltFuse(b *testing.B, n int) *xorfilter.BinaryFuse[uint16] {
	fuseMu.Lock()
	defer fuseMu.Unlock()
	if f, ok := fuseBy[n]; ok {
		return f
	}
	hs := make([]uint64, n)
	var k [KeySize]byte
	for i := range hs {
		PutKey(k[:], presentBase+uint64(i))
		hs[i] = xxh3.Hash(k[:])
	}
	f, err := xorfilter.NewBinaryFuse[uint16](hs)
	if err != nil {
		b.Fatal(err)
	}
	fuseBy[n] = f
	return f
}

// BenchmarkMemoryFloor measures what a lookup in a guard of n keys cannot
// beat on this machine: one 8-byte load at a random cache line of a region
// as large as that guard (its Stats().Bytes), with 4 KiB pages
// (MADV_NOHUGEPAGE) or 2 MiB transparent huge pages (MADV_HUGEPAGE, then
// MADV_COLLAPSE; Linux only). loads=dependent chases a random cycle
// through the region's lines, each address read from the line before: the
// latency of a miss, its page walk included. loads=independent reads lines
// whose addresses come from a register generator: the cost of a miss when
// as many are in flight as the CPU keeps. A lookup reads two buckets:
// twice the independent figure is a batch lookup's floor per key, one to
// two dependent ones a single lookup's. thp-MiB is the region's memory in
// huge pages (AnonHugePages, Linux).
func BenchmarkMemoryFloor(b *testing.B) {
	for _, sz := range batchSizes {
		if testing.Short() && sz.n > 1<<20 {
			continue
		}
		g, err := guard.New(guard.WithCapacity(sz.n), guard.WithSeed(1))
		if err != nil {
			b.Fatal(err)
		}
		bytes := g.Stats().Bytes
		g.Close()
		for _, huge := range []bool{false, true} {
			pages := map[bool]string{false: "4K", true: "2M"}[huge]
			b.Run(fmt.Sprintf("n=%s/pages=%s", sz.name, pages), func(b *testing.B) {
				// Fresh memory, so that the page size is the one asked for.
				runtime.GC()
				debug.FreeOSMemory()
				before := procMiB("/proc/self/smaps_rollup", "AnonHugePages:")
				lines := max(bytes/64, 2)
				region := make([]uint64, lines*8)
				if !adviseRegion(region, huge) && huge {
					b.Skip("no transparent huge pages here")
				}
				// A random cycle through the lines (Sattolo's algorithm).
				perm := make([]uint32, lines)
				for i := range perm {
					perm[i] = uint32(i)
				}
				r := rand.New(rand.NewPCG(1, 2))
				for i := lines - 1; i > 0; i-- {
					j := r.IntN(i)
					perm[i], perm[j] = perm[j], perm[i]
				}
				for i, p := range perm {
					region[i*8] = uint64(p) * 8
				}
				perm = nil
				if huge {
					collapseRegion(region)
				}
				thp := procMiB("/proc/self/smaps_rollup", "AnonHugePages:") - before
				b.Run("loads=dependent", func(b *testing.B) {
					x := uint64(0)
					for b.Loop() {
						x = region[x]
					}
					sink = int(x)
					if thp >= 0 {
						b.ReportMetric(thp, "thp-MiB")
					}
				})
				b.Run("loads=independent", func(b *testing.B) {
					s, x := uint64(0), uint64(0x9e3779b97f4a7c15)
					for b.Loop() {
						x ^= x << 13
						x ^= x >> 7
						x ^= x << 17
						s += region[x%uint64(lines)*8]
					}
					sink = int(s)
					if thp >= 0 {
						b.ReportMetric(thp, "thp-MiB")
					}
				})
				runtime.KeepAlive(region)
			})
		}
	}
}

// procMiB returns the figure in kB on the line of file (in /proc) that
// starts with key, in MiB, or -1 where the file does not say.
func procMiB(file, key string) float64 {
	f, err := os.Open(file)
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				return -1
			}
			return kb / 1024
		}
	}
	return -1
}

// BenchmarkGetMany measures guarded.Loader.GetMany of 1000 int64 ids, half
// of them present and half absent, at random, from a Loader whose guard
// holds n ids and whose store is an in-memory map (LookupMany answers the
// ids the guard passes in one call): part=getmany. part=guard is the
// guard's share of it, the same ids hashed with Loader.Hash and looked up
// with the guard's ContainsManyHashes; part=store the store's, its
// LookupMany of the present half. Each call takes the next of 1024
// batches.
func BenchmarkGetMany(b *testing.B) {
	const ids, batches = 1000, 1024
	ctx := context.Background()
	for _, sz := range batchSizes {
		if testing.Short() && sz.n > 1<<20 || sz.n > 1<<24 {
			continue
		}
		n := sz.n
		b.Run("n="+sz.name, func(b *testing.B) {
			rows := make(map[int64]int64, n)
			for i := range int64(n) {
				rows[i] = i
			}
			lookupMany := func(ctx context.Context, keys []int64) (map[int64]int64, error) {
				found := make(map[int64]int64, len(keys))
				for _, k := range keys {
					if v, ok := rows[k]; ok {
						found[k] = v
					}
				}
				return found, nil
			}
			g, err := guard.New(guard.WithCapacity(n), guard.WithSeed(1))
			if err != nil {
				b.Fatal(err)
			}
			l, err := guarded.New(g, guarded.Funcs[int64, int64]{
				Lookup: func(ctx context.Context, k int64) (int64, error) {
					if v, ok := rows[k]; ok {
						return v, nil
					}
					return 0, guarded.ErrNotFound
				},
				LookupMany: lookupMany,
			})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			if err := l.Fill(ctx, func(yield func(int64, error) bool) {
				for i := range int64(n) {
					if !yield(i, nil) {
						return
					}
				}
			}); err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(uint64(n), 7))
			sets := make([][]int64, batches)
			present := make([][]int64, batches)
			for j := range sets {
				sets[j] = make([]int64, ids)
				for i := range sets[j] {
					id := r.Int64N(int64(n))
					if r.IntN(2) == 0 {
						id += int64(n) // absent
					} else {
						present[j] = append(present[j], id)
					}
					sets[j][i] = id
				}
			}
			b.Run("part=getmany", func(b *testing.B) {
				b.ReportAllocs()
				j, found := 0, 0
				for b.Loop() {
					_, errs := l.GetMany(ctx, sets[j%batches])
					for _, err := range errs {
						if err == nil {
							found++
						}
					}
					j++
				}
				sink = found
			})
			b.Run("part=guard", func(b *testing.B) {
				b.ReportAllocs()
				hs, out := make([]uint64, ids), make([]bool, ids)
				j, found := 0, 0
				for b.Loop() {
					for i, id := range sets[j%batches] {
						hs[i] = l.Hash(id)
					}
					l.Guard().ContainsManyHashes(hs, out)
					for _, o := range out {
						if o {
							found++
						}
					}
					j++
				}
				sink = found
			})
			b.Run("part=store", func(b *testing.B) {
				b.ReportAllocs()
				j, found := 0, 0
				for b.Loop() {
					m, _ := lookupMany(ctx, present[j%batches])
					found += len(m)
					j++
				}
				sink = found
			})
		})
	}
}
