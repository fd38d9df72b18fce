package compare

import (
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// The benchmarks of this file are for a machine with many cores: how the
// guard and its concurrent peers scale with writers, and what a guard
// that doubles in the background costs the lookups running beside it.
// Besides -bench and -cpu, one environment variable selects what runs:
//
//	CUCKOOGUARD_BENCH_SIZES=1M,16M,128M
//
// replaces the sizes of every benchmark of the package (1M and 16M, see
// sizes): a comma-separated list of key counts, each a power of two
// written with K (2^10) or M (2^20). With it, CUCKOOGUARD_BENCH_128M is
// ignored. -short still drops the sizes above 1M.

// benchSize is the element type of sizes.
type benchSize = struct {
	name string
	n    int
}

// maxBenchSize is the largest size CUCKOOGUARD_BENCH_SIZES takes: 2^30
// keys are 32 GiB of present and absent keys.
const maxBenchSize = 1 << 30

func init() {
	v := os.Getenv("CUCKOOGUARD_BENCH_SIZES")
	if v == "" {
		return
	}
	s, err := parseSizes(v)
	if err != nil {
		// Before flags and benchmarks: there is no testing.B to fail.
		fmt.Fprintf(os.Stderr, "compare: CUCKOOGUARD_BENCH_SIZES: %v\n", err)
		os.Exit(2)
	}
	sizes = s
}

// parseSizes parses CUCKOOGUARD_BENCH_SIZES: sizes such as "64K" or
// "128M", separated by commas, each a power of two (the benchmarks index
// keys with i&(n-1)) of at most maxBenchSize keys, none twice. The name of
// a size is as written, with the unit upper-case.
func parseSizes(v string) ([]benchSize, error) {
	var out []benchSize
	seen := map[int]bool{}
	for f := range strings.SplitSeq(v, ",") {
		f = strings.ToUpper(strings.TrimSpace(f))
		if len(f) < 2 {
			return nil, fmt.Errorf("size %q: want a number followed by K or M, such as 16M", f)
		}
		shift := 0
		switch f[len(f)-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		default:
			return nil, fmt.Errorf("size %q: want a number followed by K or M, such as 16M", f)
		}
		num, err := strconv.Atoi(f[:len(f)-1])
		if err != nil || num < 1 || num > maxBenchSize>>shift {
			return nil, fmt.Errorf("size %q: want 1 to %d keys", f, maxBenchSize)
		}
		n := num << shift
		if bits.OnesCount(uint(n)) != 1 {
			return nil, fmt.Errorf("size %q is %d keys, not a power of two", f, n)
		}
		if seen[n] {
			return nil, fmt.Errorf("size %q given twice", f)
		}
		seen[n] = true
		out = append(out, benchSize{f, n})
	}
	return out, nil
}

// BenchmarkHandoff reports the machine's cache-line handoff
// (handoff-ns, [Handoff] over 20 ms per op) on its own, for the record
// of a run: the mix benchmarks report it beside each result. It logs the
// Go version the binary was built with and the CPU count. It needs -cpu
// of 2 or more, and reports nothing at 1. (It does not skip there: the
// testing package makes a benchmark's first call at the GOMAXPROCS of the
// last -cpu value, and a skip in it would skip every -cpu value.)
func BenchmarkHandoff(b *testing.B) {
	b.Logf("%s, NumCPU %d, GOMAXPROCS %d", runtime.Version(), runtime.NumCPU(), runtime.GOMAXPROCS(0))
	sum := 0.0
	for b.Loop() {
		sum += Handoff(handoffProbe)
	}
	if sum > 0 {
		b.ReportMetric(sum/float64(b.N), "handoff-ns")
	}
}

// latencyEvery is how often BenchmarkReadLatency times a lookup: one in
// 16, each one timed alone between two reads of the monotonic clock.
//
// Timing batches of lookups and dividing would cost less, but it
// averages a slow lookup with the fast ones beside it: a 5 µs stall in a
// batch of 32 lookups of 30 ns reads as 190 ns per lookup, and the tail
// that p99.9 is meant to show is gone. Timing every lookup would about
// double what a lookup costs (two clock reads take about as long as a
// lookup), and so halve the pressure the readers put on the filter. One
// in 16 keeps the clock to about a tenth of the readers' time and gives
// b.N/16 samples of the true distribution, each plus the constant cost of
// the clock, which the benchmark measures beside it (clock-ns) so that it
// can be subtracted. The samples are spread evenly over every reader's
// run, so a stall of any length is sampled in proportion to the lookups
// it holds up.
const latencyEvery = 16

// BenchmarkReadLatency measures the latency of single lookups (p50, p99,
// p99.9 and the largest, in ns) of GOMAXPROCS-1 reader goroutines (15 at
// -cpu=16; reported as readers), each doing its share of b.N lookups of
// present and absent keys in blocks of 16, while one writer goroutine
// runs flat out:
//
//   - writer=none: no writer, the readers alone;
//   - writer=churn: adds fresh keys and removes each 64 writes later, so
//     that the filter keeps its size and never doubles;
//   - writer=grow (guard only): adds fresh keys and never removes, until
//     every shard of the guard has doubled once more than the shards that
//     had doubled least (a guard of n keys can hold a shard that doubled
//     while it was filled) and no doubling is left running, or after n
//     keys. The guard is made for n keys and filled with them, then,
//     before the clock starts, with fresh keys until one shard begins to
//     double, so that the run starts with the growth.
//
// The filters are the guard and panmari256 (whose readers wait for a
// writer holding their part's lock); none and churn use the filter of n
// keys shared with the other benchmarks. One lookup in latencyEvery is
// timed; clock-ns is the median cost of the clock alone, included in
// every latency. It also reports the writer's rate while it wrote
// (writes/s), the share of the run it was writing (writing-%: for
// writer=grow, how much of the run the growth took; under 100, the run
// also holds lookups after the growth, and a smaller b.N
// (-benchtime=…x) measures the growth alone), the GC cycles during the
// run (gc-cycles), and for the guard its doublings, the background
// workers' time spent doubling as a percentage of the run (migrating-%,
// summed over the workers: it can pass 100) and the read retries per
// 1,000 lookups. A present key reported absent fails the benchmark. ns/op
// is the run's wall time per lookup of all the readers together.
func BenchmarkReadLatency(b *testing.B) {
	for _, sz := range sizes {
		if testing.Short() && sz.n > 1<<20 {
			continue
		}
		b.Run("n="+sz.name, func(b *testing.B) {
			for _, im := range Impls {
				if im.Name != "guard" && im.Name != "panmari256" {
					continue
				}
				for _, w := range []string{"none", "churn", "grow"} {
					if w == "grow" && im.Name != "guard" {
						continue
					}
					b.Run("filter="+im.Name+"/writer="+w, func(b *testing.B) {
						// Here, not in the parent: the testing package
						// sets each -cpu value for the leaves.
						readLatency(b, im, sz.n, max(runtime.GOMAXPROCS(0)-1, 1), w)
					})
				}
			}
		})
	}
}

// readerResult is what one reader of readLatency saw.
type readerResult struct {
	lat            Latencies
	hits, falseNeg int
}

// readLatency runs one case of BenchmarkReadLatency.
func readLatency(b *testing.B, im Impl, n, readers int, writer string) {
	keys := keysFor(n)
	base := uint64(FreshBase) + 1<<32 // the writer's fresh keys: base+c
	next := uint64(0)                 // the writer's next c
	var f Filter
	least := 0 // writer=grow: the doublings of the shards that had doubled least
	if writer == "grow" {
		f = im.New(n)
		g := f.(guardFilter).g
		defer g.Close()
		if err := Fill(f, keys); err != nil {
			b.Fatal(err)
		}
		least = leastDoublings(g.Stats())
		next = primeGrowth(b, g, base, n)
	} else {
		f = prebuilt(b, im, n).f
	}

	var stop atomic.Bool
	start := make(chan struct{})
	var wg sync.WaitGroup
	var writes uint64
	var writing time.Duration
	if writer != "none" {
		wg.Go(func() {
			<-start
			t := time.Now()
			var err error
			if writer == "churn" {
				writes, err = churnWriter(f, base, &stop)
			} else {
				writes, err = growWriter(f.(guardFilter).g, base+next, least, n, &stop)
			}
			writing = time.Since(t)
			if err != nil {
				b.Error(err)
			}
		})
	}
	res := make([]*readerResult, readers)
	var rwg sync.WaitGroup
	clockBase := time.Now()
	for r := range readers {
		res[r] = new(readerResult) // apart: a reader writes its own only
		count := b.N / readers
		if r < b.N%readers {
			count++
		}
		from := int(testrand.Mix(uint64(r) + 0x5ca1e))
		rwg.Go(func() {
			<-start
			readLoop(f, keys, from, count, clockBase, res[r])
		})
	}

	clock := clockCost()
	var st0 guard.Stats
	g, isGuard := f.(guardFilter)
	if isGuard {
		st0 = g.g.Stats()
	}
	runtime.GC() // the keys and filters made above: not in the run's GC
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gc0 := ms.NumGC

	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	close(start)
	rwg.Wait()
	run := time.Since(t0)
	b.StopTimer()
	var st1 guard.Stats
	if isGuard {
		st1 = g.g.Stats()
	}
	runtime.ReadMemStats(&ms)
	stop.Store(true)
	wg.Wait()

	var all Latencies
	hits, falseNeg := 0, 0
	for _, r := range res {
		all.Merge(&r.lat)
		hits += r.hits
		falseNeg += r.falseNeg
	}
	sink = hits
	if falseNeg > 0 {
		b.Fatalf("%d present keys reported absent", falseNeg)
	}
	b.ReportMetric(float64(all.Quantile(0.50)), "p50-ns")
	b.ReportMetric(float64(all.Quantile(0.99)), "p99-ns")
	b.ReportMetric(float64(all.Quantile(0.999)), "p99.9-ns")
	b.ReportMetric(float64(all.Max()), "max-ns")
	b.ReportMetric(clock, "clock-ns")
	b.ReportMetric(float64(readers), "readers")
	if writing > 0 {
		b.ReportMetric(float64(writes)/writing.Seconds(), "writes/s")
	}
	b.ReportMetric(100*min(writing.Seconds()/run.Seconds(), 1), "writing-%")
	b.ReportMetric(float64(ms.NumGC-gc0), "gc-cycles")
	if isGuard {
		lookups := float64(b.N)
		b.ReportMetric(float64(st1.Doublings-st0.Doublings), "doublings")
		b.ReportMetric(100*float64(st1.TimeMigrating-st0.TimeMigrating)/float64(run), "migrating-%")
		b.ReportMetric(1000*float64(st1.ReadRetries-st0.ReadRetries)/lookups, "retries/1k-lookups")
	}
}

// readLoop does count lookups of keys from index from on, present and
// absent keys in alternate blocks of latencyEvery, and times the first
// lookup of each block (see latencyEvery) on the monotonic clock, as
// time.Since(clockBase): unlike time.Now, it reads no wall clock.
func readLoop(f Filter, keys *Keys, from, count int, clockBase time.Time, r *readerResult) {
	mask := keys.N - 1
	hits, falseNeg := 0, 0
	for j := range count {
		i := (from + j) & mask
		present := (j/latencyEvery)&1 == 0
		k := keys.Absent(i)
		if present {
			k = keys.Present(i)
		}
		var ok bool
		if j%latencyEvery == 0 {
			t := time.Since(clockBase)
			ok = f.Contains(k)
			r.lat.Record(int64(time.Since(clockBase) - t))
		} else {
			ok = f.Contains(k)
		}
		if ok {
			hits++
		} else if present {
			falseNeg++
		}
	}
	r.hits, r.falseNeg = hits, falseNeg
}

// clockCost returns the median time of an empty timing as readLoop times
// a lookup: what every latency it records includes besides the lookup.
func clockCost() float64 {
	var l Latencies
	base := time.Now()
	for range 100_000 {
		t := time.Since(base)
		l.Record(int64(time.Since(base) - t))
	}
	return float64(l.Quantile(0.5))
}

// primeGrowth adds fresh keys base+0, base+1, … to g until one of its
// shards has begun to double (checked every 1,024 adds), and returns how
// many it added. It fails tb if none has after limit keys.
func primeGrowth(tb testing.TB, g *guard.Guard, base uint64, limit int) uint64 {
	tb.Helper()
	var k [KeySize]byte
	d0 := g.Stats().Doublings
	for c := uint64(0); c < uint64(limit); c++ {
		if c%1024 == 0 {
			if st := g.Stats(); st.Doublings > d0 || st.MigrationsInFlight+st.MigrationsQueued > 0 {
				return c
			}
		}
		PutKey(k[:], base+c)
		if err := g.Add(k[:]); err != nil {
			tb.Fatalf("priming the growth: %v", err)
		}
	}
	tb.Fatalf("no shard began to double after %d more keys", limit)
	return 0
}

// churnWriter writes to f until stop is set: it adds fresh keys base+0,
// base+1, … and once it holds 64 of them removes the oldest before each
// add, so that f keeps its size. It removes the keys it still holds
// before returning, and returns the writes it made (adds and removes).
func churnWriter(f Filter, base uint64, stop *atomic.Bool) (uint64, error) {
	const live = 64
	var ring [live][KeySize]byte
	head, held := 0, 0
	writes, c := uint64(0), uint64(0)
	var err error
	for !stop.Load() && err == nil {
		if held == live {
			if !f.Remove(ring[head][:]) {
				err = fmt.Errorf("churn: remove of fresh key %d found nothing", c-live)
			}
			head = (head + 1) % live
			held--
		}
		k := ring[(head+held)%live][:]
		PutKey(k, base+c)
		c++
		if !f.Add(k) {
			err = fmt.Errorf("churn: add of fresh key %d refused", c-1)
		} else {
			held++
		}
		writes += 2
	}
	for ; held > 0; held-- {
		if !f.Remove(ring[head][:]) && err == nil {
			err = fmt.Errorf("churn: remove of a fresh key found nothing")
		}
		head = (head + 1) % live
	}
	return writes, err
}

// leastDoublings returns the doublings of the shard that has doubled
// least.
func leastDoublings(st guard.Stats) int {
	least := st.PerShard[0].Doublings
	for _, s := range st.PerShard {
		least = min(least, s.Doublings)
	}
	return least
}

// growWriter adds fresh keys base+0, base+1, … to g until every shard has
// doubled more than least times and no doubling is running or queued,
// stop is set, or it has added limit keys. It returns how many it added.
// It looks at g's Stats, which cost O(shards) and allocate, every
// limit/256 adds (at least 1,024).
func growWriter(g *guard.Guard, base uint64, least, limit int, stop *atomic.Bool) (uint64, error) {
	var k [KeySize]byte
	check := uint64(max(limit/256, 1024))
	c := uint64(0)
	for ; c < uint64(limit) && !stop.Load(); c++ {
		if c%check == 0 && c > 0 {
			if st := g.Stats(); leastDoublings(st) > least && st.MigrationsInFlight+st.MigrationsQueued == 0 {
				break
			}
		}
		PutKey(k[:], base+c)
		if err := g.Add(k[:]); err != nil {
			return c, fmt.Errorf("grow: add of fresh key %d: %w", c, err)
		}
	}
	return c, nil
}

// guardGrow is the guard made with the default capacity (65,536 keys),
// which doubles as it fills: BenchmarkFillParallel's growing guard.
var guardGrow = Impl{
	Name: "guard-grow",
	New: func(int) Filter {
		g, err := guard.New(guard.WithSeed(1))
		if err != nil {
			panic(err)
		}
		return guardFilter{g}
	},
	BitsPerItem: func(f Filter, _ int) float64 { return f.(guardFilter).g.Stats().BitsPerItem },
	CanRemove:   true,
	Concurrent:  true,
}

// BenchmarkFillParallel measures insert-only throughput with GOMAXPROCS
// writers (16 at -cpu=16): each op fills a new filter, made with the
// timer stopped, from empty to n keys, every writer adding its own range
// of the present keys. The filters are the guard made for n keys
// (filter=guard), the guard made with the default capacity, which
// doubles about log2(n/65536) times on the way (filter=guard-grow), and
// the peers safe for concurrent use sized for n, blobloom and panmari256.
// Unlike BenchmarkAddParallel, every filter holds at most the n keys it
// was made for. ns/op is per fill; it also reports ns/add (wall time per
// key), the filter's bits/item at n keys, and the guard's doublings. The
// guard's adds return before the doublings they start end.
func BenchmarkFillParallel(b *testing.B) {
	impls := []Impl{guardGrow}
	for _, im := range Impls {
		if im.Concurrent {
			impls = append(impls, im)
		}
	}
	for _, sz := range sizes {
		if testing.Short() && sz.n > 1<<20 {
			continue
		}
		b.Run("n="+sz.name, func(b *testing.B) {
			for _, im := range impls {
				b.Run("filter="+im.Name, func(b *testing.B) { fillParallel(b, im, sz.n) })
			}
		})
	}
}

// fillParallel runs one case of BenchmarkFillParallel.
func fillParallel(b *testing.B, im Impl, n int) {
	keys := keysFor(n)
	writers := runtime.GOMAXPROCS(0)
	var last Filter
	closeGuard := func(f Filter) {
		if g, ok := f.(guardFilter); ok {
			g.g.Close()
		}
	}
	var took time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		closeGuard(last)
		f := im.New(n)
		var refused atomic.Int64
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range writers {
			lo, hi := w*n/writers, (w+1)*n/writers
			wg.Go(func() {
				<-start
				r := int64(0)
				for i := lo; i < hi; i++ {
					if !f.Add(keys.Present(i)) {
						r++
					}
				}
				refused.Add(r)
			})
		}
		b.StartTimer()
		t := time.Now()
		close(start)
		wg.Wait()
		took += time.Since(t)
		if r := refused.Load(); r > 0 {
			b.Fatalf("%d adds refused", r)
		}
		last = f
	}
	b.StopTimer()
	defer closeGuard(last)
	b.ReportMetric(float64(took.Nanoseconds())/float64(b.N)/float64(n), "ns/add")
	b.ReportMetric(im.BitsPerItem(last, n), "bits/item")
	if g, ok := last.(guardFilter); ok {
		b.ReportMetric(float64(g.g.Stats().Doublings), "doublings")
	}
}

// TestParseSizes checks CUCKOOGUARD_BENCH_SIZES' parser.
func TestParseSizes(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    []benchSize
		wantErr bool
	}{
		{in: "1M", want: []benchSize{{"1M", 1 << 20}}},
		{in: "64k, 16M,128M", want: []benchSize{{"64K", 1 << 16}, {"16M", 1 << 24}, {"128M", 1 << 27}}},
		{in: "1024M", want: []benchSize{{"1024M", 1 << 30}}},
		{in: "100M", wantErr: true},  // not a power of two
		{in: "2048M", wantErr: true}, // too large
		{in: "1M,1024K", wantErr: true},
		{in: "16", wantErr: true},
		{in: "M", wantErr: true},
		{in: "0M", wantErr: true},
		{in: "-1M", wantErr: true},
		{in: "1G", wantErr: true},
		{in: "1M,", wantErr: true},
	} {
		got, err := parseSizes(c.in)
		if (err != nil) != c.wantErr {
			t.Errorf("parseSizes(%q) error = %v, want error: %v", c.in, err, c.wantErr)
			continue
		}
		if !c.wantErr && fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("parseSizes(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

// stopAfter is a Filter that sets stop once adds adds have been made.
type stopAfter struct {
	Filter
	adds int
	stop *atomic.Bool
}

func (s *stopAfter) Add(k []byte) bool {
	if s.adds--; s.adds <= 0 {
		s.stop.Store(true)
	}
	return s.Filter.Add(k)
}

// TestChurnWriter checks that the churn writer leaves the guard with the
// keys it started with, every one still present.
func TestChurnWriter(t *testing.T) {
	keys := NewKeys(1 << 12)
	g, err := guard.New(guard.WithCapacity(keys.N), guard.WithSeed(1))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := Fill(guardFilter{g}, keys); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	writes, err := churnWriter(&stopAfter{guardFilter{g}, 1000, &stop}, FreshBase, &stop)
	if err != nil {
		t.Fatal(err)
	}
	if writes != 2000 {
		t.Errorf("writes = %d, want 2000 (1,000 adds and as many removes)", writes)
	}
	if got := g.Len(); got != keys.N {
		t.Errorf("guard holds %d keys after the churn, want %d", got, keys.N)
	}
	if miss := FalseNegatives(guardFilter{g}, keys); miss > 0 {
		t.Errorf("%d false negatives after the churn", miss)
	}
}

// TestGrowWriter checks that the writer of writer=grow, after
// primeGrowth, stops because every shard has doubled once more, not at
// its limit, and leaves no doubling running.
func TestGrowWriter(t *testing.T) {
	const n = 1 << 16
	keys := NewKeys(n)
	g, err := guard.New(guard.WithCapacity(n), guard.WithSeed(1))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := Fill(guardFilter{g}, keys); err != nil {
		t.Fatal(err)
	}
	least := leastDoublings(g.Stats())
	primed := primeGrowth(t, g, FreshBase, n)
	var stop atomic.Bool
	added, err := growWriter(g, FreshBase+primed, least, n, &stop)
	if err != nil {
		t.Fatal(err)
	}
	st := g.Stats()
	if got := leastDoublings(st); got <= least {
		t.Errorf("after %d adds the least doubled shard has doubled %d times, want more than %d", added, got, least)
	}
	if added >= n {
		t.Errorf("the writer stopped at its limit (%d adds), not when the growth ended", added)
	}
	if st.MigrationsInFlight+st.MigrationsQueued > 0 {
		t.Errorf("%d doublings running and %d queued after the writer stopped, want none", st.MigrationsInFlight, st.MigrationsQueued)
	}
	if miss := FalseNegatives(guardFilter{g}, keys); miss > 0 {
		t.Errorf("%d false negatives after the growth", miss)
	}
}
