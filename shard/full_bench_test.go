package shard

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkLookupFullShard measures lookups of absent items on a shard
// that cannot take another item, while two writers keep trying to insert
// into it (as a Loader's fill or a retrying client would). It reports the
// miss latency (p50, p99, max, clock read included) and the read retries
// per lookup: a writer's eviction walk keeps the sequence odd, and a
// lookup that overlaps it retries.
func BenchmarkLookupFullShard(b *testing.B) {
	const k = 12
	r := rand.New(rand.NewPCG(1, 2))
	s, err := New(k)
	if err != nil {
		b.Fatal(err)
	}
	for {
		it := randomItem(r)
		if err := s.Insert(it.f, it.v); errors.Is(err, ErrFull) {
			break
		} else if err != nil {
			b.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed [2]int
	for w := range 2 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 3))
			for {
				select {
				case <-stop:
					return
				default:
				}
				it := randomItem(r)
				if s.Insert(it.f, it.v) != nil {
					failed[w]++
				}
			}
		})
	}
	probes := make([]item, 1<<16)
	for i := range probes {
		probes[i] = randomItem(r)
	}
	lat := make([]time.Duration, 0, b.N)
	retries0 := s.retries.Load()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		it := probes[i&(len(probes)-1)]
		i++
		t0 := time.Now()
		s.Contains(it.f, it.v)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) }
	b.ReportMetric(q(0.5), "p50-ns")
	b.ReportMetric(q(0.99), "p99-ns")
	b.ReportMetric(float64(lat[len(lat)-1].Nanoseconds()), "max-ns")
	b.ReportMetric(float64(s.retries.Load()-retries0)/float64(len(lat)), "retries/op")
	b.ReportMetric(float64(failed[0]+failed[1])/float64(len(lat)), "failed-inserts/op")
}
