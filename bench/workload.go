package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// Latencies are recorded in microseconds from 1 µs to 60 s, 3 digits.
const (
	histMin    = 1
	histMax    = 60_000_000
	histDigits = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histDigits) }

// keyGen draws the ids of a workload: present ids 1..rows (uniform or
// Zipf), absent ids above rows.
type keyGen struct {
	r      *rand.Rand
	zipf   *rand.Zipf
	rows   int64
	absent float64
}

func newKeyGen(c config, worker int) *keyGen {
	r := rand.New(rand.NewPCG(c.Seed, uint64(worker)))
	k := &keyGen{r: r, rows: c.Rows, absent: c.Absent}
	if c.Dist == "zipf" {
		k.zipf = rand.NewZipf(r, c.ZipfS, 1, uint64(c.Rows-1))
	}
	return k
}

// next returns an id and whether it exists.
func (k *keyGen) next() (int64, bool) {
	if k.r.Float64() < k.absent {
		return k.rows + 1 + k.r.Int64N(1<<40), false
	}
	if k.zipf != nil {
		return 1 + int64(k.zipf.Uint64()), true
	}
	return 1 + k.r.Int64N(k.rows), true
}

// lookupFunc runs one lookup; ErrNotFound (or a wrapped sql.ErrNoRows) is
// an answer, not an error.
type lookupFunc func(ctx context.Context, id int64) error

// phase is the measured outcome of one run.
type phase struct {
	Name       string                  `json:"name"`
	Ops        int64                   `json:"ops"`
	Errors     int64                   `json:"errors"`
	Elapsed    time.Duration           `json:"elapsed_ns"`
	Found      int64                   `json:"found"`
	NotFound   int64                   `json:"not_found"`
	WrongFound int64                   `json:"wrong_answers"` // present id not found, or absent id found
	Hist       *hdrhistogram.Histogram `json:"-"`
	// The same latencies split by whether the id exists: the guard is
	// for the absent ones and must cost the present ones nothing.
	HistPresent *hdrhistogram.Histogram `json:"-"`
	HistAbsent  *hdrhistogram.Histogram `json:"-"`
	Bucket      time.Duration           `json:"timeline_bucket_ns"`
	Timeline    []second                `json:"timeline"`
	Doublings   []time.Duration         `json:"doubling_offsets_ns"`

	Queries       int64   `json:"db_queries"`
	Avoided       int64   `json:"queries_avoided"`
	FalsePos      int64   `json:"false_positives"`
	ObservedFPR   float64 `json:"observed_fpr"`
	GuardBytes    int     `json:"guard_bytes"`
	BitsPerItem   float64 `json:"bits_per_item"`
	GuardItems    int     `json:"guard_items"`
	DoublingCount int     `json:"doublings"`
	Guarded       bool    `json:"guarded"`
}

// second is one time bucket of a run (Bucket long, see phase).
type second struct {
	RPS   float64 `json:"requests_per_second"`
	P99us int64   `json:"p99_us"`
}

func (p *phase) RPS() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Ops) / p.Elapsed.Seconds()
}

// quantile returns the latency at q in microseconds.
func (p *phase) quantile(q float64) int64 {
	return quantile(p.Hist, q)
}

// quantile returns the value of h at q in microseconds, 0 for no values.
func quantile(h *hdrhistogram.Histogram, q float64) int64 {
	if h == nil || h.TotalCount() == 0 {
		return 0
	}
	return h.ValueAtQuantile(q * 100)
}

// runPhase runs workers that call lookup until the duration passes or ops
// operations are done, recording latencies overall and per second.
// progress, if not nil, is called with the elapsed fraction in [0, 1].
func runPhase(ctx context.Context, c config, name string, lookup lookupFunc, progress func(done float64)) *phase {
	p := &phase{Name: name, Hist: newHist(), HistPresent: newHist(), HistAbsent: newHist(), Bucket: bucketFor(c)}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	var done atomic.Int64
	type workerOut struct {
		hist      *hdrhistogram.Histogram
		byClass   [2]*hdrhistogram.Histogram // absent, present
		secs      []*hdrhistogram.Histogram
		found     int64
		notFound  int64
		wrong     int64
		errs      int64
		completed int64
	}
	outs := make([]workerOut, c.Workers)
	var wg sync.WaitGroup
	for w := range c.Workers {
		wg.Go(func() {
			o := &outs[w]
			o.hist = newHist()
			o.byClass = [2]*hdrhistogram.Histogram{newHist(), newHist()}
			keys := newKeyGen(c, w)
			for ctx.Err() == nil {
				if c.Ops > 0 && done.Add(1) > c.Ops {
					return
				}
				id, exists := keys.next()
				t0 := time.Now()
				err := lookup(ctx, id)
				d := time.Since(t0)
				if ctx.Err() != nil && err != nil {
					return // the run ended under this call: do not count it
				}
				us := min(max(d.Microseconds(), histMin), histMax)
				o.hist.RecordValue(us)
				class := 0
				if exists {
					class = 1
				}
				o.byClass[class].RecordValue(us)
				sec := int(t0.Sub(start) / p.Bucket)
				for len(o.secs) <= sec {
					o.secs = append(o.secs, newHist())
				}
				o.secs[sec].RecordValue(us)
				o.completed++
				switch {
				case err == nil:
					o.found++
					if !exists {
						o.wrong++
					}
				case errors.Is(err, guarded.ErrNotFound):
					o.notFound++
					if exists {
						o.wrong++
					}
				default:
					o.errs++
				}
			}
		})
	}
	if c.Ops == 0 {
		t := time.NewTimer(c.Duration)
		tick := time.NewTicker(200 * time.Millisecond)
	wait:
		for {
			select {
			case <-t.C:
				break wait
			case <-ctx.Done():
				break wait
			case <-tick.C:
				if progress != nil {
					progress(min(time.Since(start).Seconds()/c.Duration.Seconds(), 1))
				}
			}
		}
		tick.Stop()
		cancel()
	}
	wg.Wait()
	p.Elapsed = time.Since(start)
	if progress != nil {
		progress(1)
	}
	var secs []*hdrhistogram.Histogram
	for _, o := range outs {
		p.Hist.Merge(o.hist)
		p.HistAbsent.Merge(o.byClass[0])
		p.HistPresent.Merge(o.byClass[1])
		p.Ops += o.completed
		p.Found += o.found
		p.NotFound += o.notFound
		p.WrongFound += o.wrong
		p.Errors += o.errs
		for i, h := range o.secs {
			for len(secs) <= i {
				secs = append(secs, newHist())
			}
			secs[i].Merge(h)
		}
	}
	// Only whole buckets: the last, partial one would show a false drop.
	whole := min(len(secs), int(p.Elapsed/p.Bucket))
	for _, h := range secs[:whole] {
		p.Timeline = append(p.Timeline, second{RPS: float64(h.TotalCount()) / p.Bucket.Seconds(), P99us: h.ValueAtQuantile(99)})
	}
	return p
}

// bucketFor returns the width of the timeline's buckets: about 50 of them
// per run, at least 100 ms; 250 ms when the run is a number of operations.
func bucketFor(c config) time.Duration {
	if c.Ops > 0 {
		return 250 * time.Millisecond
	}
	return max((c.Duration / 50).Round(100*time.Millisecond), 100*time.Millisecond)
}
