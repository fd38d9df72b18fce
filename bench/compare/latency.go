package compare

import "math/bits"

// latencySub is log2 of the number of buckets per power of two in a
// [Latencies]: 64, so a quantile is within 1/128 (0.8 %) of the value
// recorded. Values below 2·64 have a bucket each.
const latencySub = 6

// latencyBuckets covers values up to 2^40 ns (about 18 minutes); larger
// ones go into the last bucket.
const latencyBuckets = 2<<latencySub + (40-latencySub)<<latencySub

// Latencies is a histogram of durations in nanoseconds with log-linear
// buckets: exact below 128 ns, then 64 buckets per power of two. Record
// costs a few instructions and never allocates, so that a benchmark can
// record in its loop. The zero value is empty and ready for use.
// Latencies is not safe for concurrent use: give each goroutine its own
// and [Latencies.Merge] them.
type Latencies struct {
	counts [latencyBuckets]uint64
	total  uint64
	max    int64
}

// latencyBucket returns the bucket of v ≥ 0.
func latencyBucket(v uint64) int {
	if v < 2<<latencySub {
		return int(v)
	}
	e := bits.Len64(v) - latencySub - 1 // v>>e is in [64, 128)
	i := e<<latencySub + int(v>>e)
	return min(i, latencyBuckets-1)
}

// latencyMid returns the middle of bucket i: the value a quantile in it
// reports.
func latencyMid(i int) int64 {
	if i < 2<<latencySub {
		return int64(i)
	}
	e := i>>latencySub - 1
	lo := uint64(i&(1<<latencySub-1)|1<<latencySub) << e
	return int64(lo + (uint64(1)<<e)/2)
}

// Record adds one duration of ns nanoseconds; a negative one counts as 0.
func (l *Latencies) Record(ns int64) {
	ns = max(ns, 0)
	l.counts[latencyBucket(uint64(ns))]++
	l.total++
	l.max = max(l.max, ns)
}

// Merge adds the durations of o to l.
func (l *Latencies) Merge(o *Latencies) {
	for i, c := range o.counts {
		l.counts[i] += c
	}
	l.total += o.total
	l.max = max(l.max, o.max)
}

// Count returns the number of durations recorded.
func (l *Latencies) Count() uint64 { return l.total }

// Max returns the largest duration recorded, exactly; 0 if none.
func (l *Latencies) Max() int64 { return l.max }

// Quantile returns the q-quantile (0 < q ≤ 1) of the durations recorded:
// the middle of the bucket that holds the ⌈q·Count⌉-th smallest, never
// more than Max. It returns 0 if none were recorded.
func (l *Latencies) Quantile(q float64) int64 {
	if l.total == 0 {
		return 0
	}
	rank := uint64(q*float64(l.total) + 0.999999)
	rank = min(max(rank, 1), l.total)
	seen := uint64(0)
	for i, c := range l.counts {
		if seen += c; seen >= rank {
			return min(latencyMid(i), l.max)
		}
	}
	return l.max
}
