package resize

import (
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/shard"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type item struct {
	f uint8
	v uint64
}

// fill inserts items into s until its load factor reaches load, and
// returns them.
func fill(t *testing.T, s *shard.Shard, r *rand.Rand, load float64) []item {
	t.Helper()
	var items []item
	for s.LoadFactor() < load {
		it := item{f: uint8(r.IntN(255) + 1), v: r.Uint64() &^ (1<<24 - 1)}
		if err := s.Insert(it.f, it.v); err != nil {
			t.Fatalf("Insert: %v", err)
		}
		items = append(items, it)
	}
	return items
}

func checkItems(t *testing.T, s *shard.Shard, items []item) {
	t.Helper()
	for _, it := range items {
		if !s.Contains(it.f, it.v) {
			t.Fatalf("false negative for %+v", it)
		}
	}
}

// mustNewShard returns a shard of 2^k buckets under a growth policy of
// threshold 0.8.
func mustNewShard(t *testing.T, k int) *shard.Shard {
	t.Helper()
	s, err := shard.New(k)
	if err != nil {
		t.Fatal(err)
	}
	g, err := shard.NewGrowth(0.8, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetGrowth(g); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	tests := []struct {
		name string
		opt  Option
	}{
		{"workers 0", WithWorkers(0)},
		{"chunk 0", withChunk(0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r, err := New(tt.opt); err == nil || r != nil {
				t.Fatalf("New = %v, %v; want nil, error", r, err)
			}
		})
	}
}

// TestMaybeDoublesInBackground queues a shard at its threshold and checks
// that a background worker doubles it, and that a shard below the
// threshold, or without a growth policy, is left alone.
func TestMaybeDoublesInBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, err := New(withChunk(7))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rng := rand.New(rand.NewPCG(1, 2))
		full, empty := mustNewShard(t, 8), mustNewShard(t, 8)
		items := fill(t, full, rng, 0.8)
		free, err := shard.New(8) // no growth policy
		if err != nil {
			t.Fatal(err)
		}
		fill(t, free, rng, 0.85)
		r.Maybe(full)
		r.Maybe(full) // queued once
		r.Maybe(empty)
		r.Maybe(free)
		synctest.Wait() // every goroutine of the Resizer is idle again
		if got := full.Doublings(); got != 1 {
			t.Fatalf("full shard doubled %d times, want 1", got)
		}
		if empty.Doublings() != 0 || free.Doublings() != 0 {
			t.Fatalf("a shard below the threshold, or without a policy, was doubled")
		}
		checkItems(t, full, items)
		st := r.Stats()
		if st.Completed != 1 || st.InFlight != 0 || st.Queued != 0 {
			t.Fatalf("Stats = %+v, want 1 completed, none in flight or queued", st)
		}
	})
}

// TestWorkersBoundConcurrency queues many shards with one worker and checks
// that at most one migration runs at a time and all finish.
func TestWorkersBoundConcurrency(t *testing.T) {
	r, err := New(WithWorkers(1), withChunk(1))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	shards := make([]*shard.Shard, 8)
	items := make([][]item, len(shards))
	for i := range shards {
		shards[i] = mustNewShard(t, 6)
		items[i] = fill(t, shards[i], rng, 0.9)
		r.Maybe(shards[i])
	}
	deadline := time.Now().Add(time.Minute)
	for r.Stats().Completed < int64(len(shards)) {
		if n := r.Stats().InFlight; n > 1 {
			t.Fatalf("%d migrations in flight with one worker", n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("migrations did not finish: %+v", r.Stats())
		}
		runtime.Gosched()
	}
	for i, s := range shards {
		checkItems(t, s, items[i])
	}
}

// TestMaybeLeavesCappedShard: a shard whose next table would pass its
// policy's memory cap is not queued, and a worker that finds it so when
// its turn comes does nothing; the shard keeps its items and its size.
func TestMaybeLeavesCappedShard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, err := New()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		s, err := shard.New(6)
		if err != nil {
			t.Fatal(err)
		}
		g, err := shard.NewGrowth(0.8, int64(s.Stats().Bytes)+100)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetGrowth(g); err != nil {
			t.Fatal(err)
		}
		items := fill(t, s, rand.New(rand.NewPCG(9, 9)), 0.85)
		r.Maybe(s)
		synctest.Wait()
		if s.Doublings() != 0 || r.Stats().Queued != 0 || r.Stats().Completed != 0 {
			t.Fatalf("a shard at its memory cap: %d doublings, %+v", s.Doublings(), r.Stats())
		}
		r.migrate(s) // as a worker whose shard lost the room since Maybe
		if s.Doublings() != 0 || s.Growing() || r.Stats().Completed != 0 {
			t.Fatalf("migrate doubled a shard at its memory cap: %+v", r.Stats())
		}
		checkItems(t, s, items)
	})
}

// TestCloseMidMigration closes the Resizer while a slow migration runs and
// checks that the shard stays readable and writable, and that inserts
// finish the doubling.
func TestCloseMidMigration(t *testing.T) {
	r, err := New(withChunk(1))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	s := mustNewShard(t, 14)
	items := fill(t, s, rng, 0.9)
	r.Maybe(s)
	for !s.Growing() && s.Doublings() == 0 {
		runtime.Gosched()
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("closed with the shard growing=%v, %+v", s.Growing(), r.Stats())
	checkItems(t, s, items)
	items = append(items, fill(t, s, rng, 0.95)...)
	checkItems(t, s, items)
	if s.Growing() {
		t.Logf("shard still growing after more inserts (free slots sufficed)")
	}
}

func TestCloseIsIdempotentAndConcurrent(t *testing.T) {
	r, err := New()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := r.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	s := mustNewShard(t, 2)
	fill(t, s, rand.New(rand.NewPCG(7, 8)), 0.95)
	r.Maybe(s) // ignored after Close
	if st := r.Stats(); st.Queued != 0 {
		t.Fatalf("Maybe after Close queued a shard: %+v", st)
	}
}

// TestNilArguments: a nil option is an error that says so, and Maybe of a
// nil shard does nothing.
func TestNilArguments(t *testing.T) {
	if r, err := New(nil); r != nil || err == nil || !strings.Contains(err.Error(), "option 1 of 1 is nil") {
		t.Fatalf("New(nil) = %v, %v; want nil and an error naming the option", r, err)
	}
	r, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Maybe(nil)
}

// resizerGoroutines returns the number of goroutines running a Resizer's
// code. runtime.NumGoroutine is no use here: it may count for a moment a
// goroutine that has returned.
func resizerGoroutines() int {
	buf := make([]byte, 1<<20)
	n := 0
	for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "resize.(*Resizer)") {
			n++
		}
	}
	return n
}

// TestIdleResizerHoldsNoGoroutine checks that a Resizer starts its
// dispatcher only for queued work and that the dispatcher returns once the
// queue is empty: a process with many small, idle guards holds no
// goroutine (and no stack) for each.
func TestIdleResizerHoldsNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, err := New()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if n := resizerGoroutines(); n != 0 {
			t.Fatalf("%d goroutines of the Resizer after New, want 0", n)
		}
		rng := rand.New(rand.NewPCG(3, 4))
		for round := range 3 {
			s := mustNewShard(t, 6)
			fill(t, s, rng, 0.85)
			r.Maybe(s)
			synctest.Wait()
			if s.Doublings() != 1 {
				t.Fatalf("round %d: shard doubled %d times, want 1", round, s.Doublings())
			}
			if n := resizerGoroutines(); n != 0 {
				t.Fatalf("round %d: %d goroutines of the Resizer once the queue is empty, want 0", round, n)
			}
		}
	})
}

// TestMaybeRacesClose queues shards from many goroutines while the
// Resizer closes: no Maybe may start a dispatcher that Close does not wait
// for (the race detector and goleak watch), and none panics.
func TestMaybeRacesClose(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		r, err := New()
		if err != nil {
			t.Fatal(err)
		}
		shards := make([]*shard.Shard, 8)
		for i := range shards {
			shards[i] = mustNewShard(t, 4)
			fill(t, shards[i], rng, 0.85)
		}
		var wg sync.WaitGroup
		for _, s := range shards {
			wg.Go(func() { r.Maybe(s) })
		}
		r.Close()
		wg.Wait()
		r.Close()
	}
}
