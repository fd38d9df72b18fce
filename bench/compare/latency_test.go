package compare

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestLatencyBuckets checks that every value falls in a bucket whose
// middle is within 1/128 of it, and that buckets grow with the values.
func TestLatencyBuckets(t *testing.T) {
	prev := 0
	for v := uint64(0); v < 1<<41; v = v + 1 + v/97 {
		i := latencyBucket(v)
		if i < prev {
			t.Fatalf("latencyBucket(%d) = %d, below latencyBucket of a smaller value (%d)", v, i, prev)
		}
		prev = i
		if v >= 1<<40 {
			continue // the last bucket takes the rest
		}
		mid := float64(latencyMid(i))
		if d := mid - float64(v); d > float64(v)/128 || -d > float64(v)/128 {
			t.Fatalf("value %d: bucket %d has middle %v, more than 1/128 away", v, i, mid)
		}
	}
	if got := latencyBucket(1 << 62); got != latencyBuckets-1 {
		t.Errorf("latencyBucket(2^62) = %d, want the last bucket %d", got, latencyBuckets-1)
	}
}

// TestLatenciesQuantile checks quantiles against the sorted values, on
// two histograms merged.
func TestLatenciesQuantile(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var a, b Latencies
	var vals []int64
	for i := range 100_000 {
		v := int64(rng.ExpFloat64() * 50)
		if i%1000 == 0 {
			v = int64(rng.IntN(5_000_000)) // a tail
		}
		vals = append(vals, v)
		if i%2 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	a.Merge(&b)
	slices.Sort(vals)
	if got, want := a.Count(), uint64(len(vals)); got != want {
		t.Fatalf("Count = %d, want %d", got, want)
	}
	if got, want := a.Max(), vals[len(vals)-1]; got != want {
		t.Errorf("Max = %d, want %d", got, want)
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
		want := vals[int(q*float64(len(vals))+0.999999)-1]
		got := a.Quantile(q)
		if d := float64(got - want); d > float64(want)/128+0.5 || -d > float64(want)/128+0.5 {
			t.Errorf("Quantile(%v) = %d, want %d within 1/128", q, got, want)
		}
	}
	var empty Latencies
	if got := empty.Quantile(0.5); got != 0 {
		t.Errorf("Quantile of an empty histogram = %d, want 0", got)
	}
	empty.Record(-5)
	if got := empty.Quantile(1); got != 0 {
		t.Errorf("a negative duration reads back as %d, want 0", got)
	}
}
