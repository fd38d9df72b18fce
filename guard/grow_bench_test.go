package guard

import (
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkGrow measures adding keys to a guard declared much smaller, so
// that every shard doubles repeatedly in the background: WithCapacity(1000)
// to 2M keys (2000×) and the default capacity to 20M. It reports ns per
// key, seconds per whole growth, the doublings of the shard that doubled
// most, bits per key and the false-positive rate measured at the end.
func BenchmarkGrow(b *testing.B) {
	for _, c := range []struct{ from, to int }{{1000, 2_000_000}, {DefaultCapacity, 20_000_000}} {
		b.Run(fmt.Sprintf("from=%d/to=%d", c.from, c.to), func(b *testing.B) {
			n := c.to
			keys := benchKeys(1<<bits.Len(uint(n-1)), 4)[:n]
			b.ReportAllocs()
			var st Stats
			var fpr float64
			var total time.Duration
			rounds := 0
			for b.Loop() {
				b.StopTimer()
				g, err := New(WithCapacity(c.from), WithSeed(1))
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				for _, k := range keys {
					if err := g.Add(k); err != nil {
						b.Fatal(err)
					}
				}
				total += time.Since(start)
				rounds++
				b.StopTimer()
				st = g.Stats()
				fpr = measureFPR(g, 1_000_000)
				g.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(rounds*n), "ns/key")
			b.ReportMetric(total.Seconds()/float64(rounds), "s/grow")
			b.ReportMetric(float64(st.MaxDoublings), "doublings")
			b.ReportMetric(st.BitsPerItem, "bits/item")
			b.ReportMetric(fpr, "fpr")
			b.ReportMetric(st.EstimatedFPR, "est-fpr")
		})
	}
}

// BenchmarkLookupLatency measures the latency of single negative lookups
// on one goroutine, steady (no writes) and while another goroutine adds
// keys continuously to a guard that starts at capacity 1000 and doubles
// through the run. It reports p50, p99 and p99.9 in ns, including the
// cost of reading the clock (the same in both cases).
func BenchmarkLookupLatency(b *testing.B) {
	const prefill = 1 << 16
	absent := benchKeys(1<<16, 5)
	for _, growing := range []bool{false, true} {
		b.Run(fmt.Sprintf("growing=%v", growing), func(b *testing.B) {
			g, err := New(WithCapacity(1000), WithSeed(1))
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			for i := range prefill {
				if err := g.AddString(strconv.Itoa(i)); err != nil {
					b.Fatal(err)
				}
			}
			d0 := g.Stats().Doublings
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var added atomic.Int64
			if growing {
				wg.Go(func() {
					for i := prefill; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if err := g.AddString(strconv.Itoa(i)); err != nil {
							return // full (it cannot be): stop writing
						}
						added.Add(1)
					}
				})
			}
			lat := make([]int64, 0, 1<<20)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := absent[i&(len(absent)-1)]
				start := time.Now()
				g.Contains(k)
				d := time.Since(start)
				if len(lat) < cap(lat) {
					lat = append(lat, int64(d))
				} else {
					lat[i&(len(lat)-1)] = int64(d) // keep a sliding sample
				}
				i++
			}
			close(stop)
			wg.Wait()
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) }
			b.ReportMetric(q(0.50), "p50-ns")
			b.ReportMetric(q(0.99), "p99-ns")
			b.ReportMetric(q(0.999), "p99.9-ns")
			b.ReportMetric(float64(g.Stats().Doublings-d0), "doublings")
			b.ReportMetric(float64(added.Load()), "keys-added")
		})
	}
}
