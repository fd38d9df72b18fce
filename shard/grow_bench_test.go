package shard

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkGrowStep measures the cost of a doubling, one step of
// DefaultChunk buckets per op, on a shard of 2^16 buckets at load 0.9, and
// reports it per migrated bucket.
func BenchmarkGrowStep(b *testing.B) {
	const k = 16
	r := rand.New(rand.NewPCG(1, 2))
	var s *Shard
	b.ReportAllocs()
	migrated := 0
	for b.Loop() {
		if s == nil || !s.Growing() {
			b.StopTimer()
			s, _ = New(k)
			for s.LoadFactor() < 0.9 {
				it := randomItem(r)
				if err := s.Insert(it.f, it.v); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := s.beginGrow(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		s.GrowStep(DefaultChunk)
		migrated += DefaultChunk
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(migrated), "ns/bucket")
}
