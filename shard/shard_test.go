package shard

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// item is what a caller hands a shard: a fingerprint and a virtual index.
type item struct {
	f uint8
	v uint64
}

func randomItem(r *rand.Rand) item {
	return item{f: uint8(r.IntN(255) + 1), v: r.Uint64() & (1<<VirtualBits - 1)}
}

func mustNew(t testing.TB, k int) *Shard {
	t.Helper()
	s, err := New(k)
	if err != nil {
		t.Fatalf("New(%d): %v", k, err)
	}
	return s
}

func TestNewRejectsBadSizes(t *testing.T) {
	for _, k := range []int{-1, 0, MaxLog2Buckets + 1, 64} {
		if s, err := New(k); err == nil || s != nil {
			t.Errorf("New(%d) = %v, %v; want nil, error", k, s, err)
		}
	}
	if _, err := New(1); err != nil {
		t.Errorf("New(1): %v", err)
	}
}

func TestZeroFingerprintRejected(t *testing.T) {
	s := mustNew(t, 4)
	if err := s.Insert(0, 1); !errors.Is(err, ErrZeroFingerprint) {
		t.Fatalf("Insert(0, 1) = %v, want ErrZeroFingerprint", err)
	}
	if s.Delete(0, 1) || s.Len() != 0 {
		t.Fatalf("Delete(0, 1) changed the shard")
	}
}

// checkAll fails the test if any item of the model reads absent.
func checkAll(t *testing.T, s *Shard, model map[item]int, when string) {
	t.Helper()
	n := 0
	for it, c := range model {
		if !s.Contains(it.f, it.v) {
			t.Fatalf("%s: false negative for %+v (inserted %d times)", when, it, c)
		}
		n += c
	}
	if s.Len() != n {
		t.Fatalf("%s: Len() = %d, want %d", when, s.Len(), n)
	}
}

// TestModel runs random operation sequences against a plain map: inserts,
// repeated inserts of the same item, deletes of inserted items, lookups
// and doublings, on a small table so that eviction walks, ErrFull,
// rollback and the stash all happen.
func TestModel(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 0))
	rounds := 40
	if testing.Short() {
		rounds = 8
	}
	var fulls, grows, stashed int
	for round := range rounds {
		s := mustNew(t, 1+r.IntN(6))
		grow := round%2 == 0 // half the rounds fill up and see ErrFull
		model := map[item]int{}
		var keys []item
		ops := 3000 + r.IntN(3000)
		for op := range ops {
			switch x := r.IntN(100); {
			case x < 45: // insert a new item, or repeat an existing one (≤ 8 copies)
				it := randomItem(r)
				if len(keys) > 0 && r.IntN(5) == 0 {
					it = keys[r.IntN(len(keys))]
					if model[it] >= 8 {
						continue
					}
				}
				err := s.Insert(it.f, it.v)
				if errors.Is(err, ErrFull) {
					if fulls++; fulls%16 == 1 {
						checkAll(t, s, model, "after ErrFull")
					}
					if grow && r.IntN(2) == 0 {
						if err := s.Grow(); err == nil {
							grows++
						}
					}
					continue
				}
				if err != nil {
					t.Fatalf("round %d op %d: Insert: %v", round, op, err)
				}
				if model[it] == 0 {
					keys = append(keys, it)
				}
				model[it]++
			case x < 70: // delete an inserted item
				if len(keys) == 0 {
					continue
				}
				i := r.IntN(len(keys))
				it := keys[i]
				if !s.Delete(it.f, it.v) {
					t.Fatalf("round %d op %d: Delete(%+v) = false for an inserted item", round, op, it)
				}
				if model[it]--; model[it] == 0 {
					delete(model, it)
					keys[i] = keys[len(keys)-1]
					keys = keys[:len(keys)-1]
				}
			case x < 97: // lookup
				if len(keys) > 0 {
					it := keys[r.IntN(len(keys))]
					if !s.Contains(it.f, it.v) {
						t.Fatalf("round %d op %d: false negative for %+v", round, op, it)
					}
				}
			case !grow:
			case x < 99: // start a doubling, or advance one by a small chunk
				if s.Growing() {
					if s.GrowStep(1 + r.IntN(4)) {
						grows++
					}
				} else if _, err := s.BeginGrow(); err != nil && !errors.Is(err, ErrSaturated) {
					t.Fatalf("BeginGrow: %v", err)
				}
			default:
				if err := s.Grow(); err == nil {
					grows++
				} else if !errors.Is(err, ErrSaturated) {
					t.Fatalf("Grow: %v", err)
				}
			}
			if st := s.Stats(); st.Stashed > 0 {
				stashed++
			}
		}
		checkAll(t, s, model, "end of round")
	}
	t.Logf("ErrFull %d times, %d doublings, %d ops with a nonempty stash", fulls, grows, stashed)
	if fulls == 0 || grows == 0 || stashed == 0 {
		t.Errorf("the model test did not reach ErrFull (%d), Grow (%d) and the stash (%d)", fulls, grows, stashed)
	}
}

// TestFullShardLosesNothing fills a shard until inserts fail many times in a
// row and checks that every item stored before is still found.
func TestFullShardLosesNothing(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 1))
	s := mustNew(t, 8)
	model := map[item]int{}
	fails := 0
	for fails < 200 {
		it := randomItem(r)
		if err := s.Insert(it.f, it.v); err != nil {
			if !errors.Is(err, ErrFull) {
				t.Fatal(err)
			}
			fails++
			continue
		}
		model[it]++
	}
	checkAll(t, s, model, "full shard")
	st := s.Stats()
	t.Logf("load at 200 failures: %.4f, stash %d", st.LoadFactor, st.Stashed)
	if st.LoadFactor < 0.9 {
		t.Errorf("load factor %.3f at saturation, want >= 0.9 for a (2,4)-cuckoo filter", st.LoadFactor)
	}
}

// TestFullShardStopsWalking checks that once an eviction walk has failed,
// inserts that would need one fail at once, without a walk (which keeps
// the sequence odd and makes lookups retry), until a delete makes room.
func TestFullShardStopsWalking(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 4))
	s := mustNew(t, 6)
	var in []item
	for {
		it := randomItem(r)
		err := s.Insert(it.f, it.v)
		if errors.Is(err, ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, it)
	}
	walked := 0
	for range 1000 {
		seq := s.seq.Load()
		it := randomItem(r)
		if err := s.Insert(it.f, it.v); !errors.Is(err, ErrFull) {
			if err != nil {
				t.Fatal(err)
			}
			in = append(in, it) // a free slot in one of its buckets
			continue
		}
		if s.seq.Load() != seq {
			walked++
		}
	}
	if walked != 0 {
		t.Fatalf("%d of the inserts into a full shard walked again", walked)
	}
	if !s.Delete(in[0].f, in[0].v) {
		t.Fatal("Delete of an inserted item failed")
	}
	in = in[1:]
	seq := s.seq.Load()
	for s.seq.Load() == seq { // until an insert walks again
		it := randomItem(r)
		err := s.Insert(it.f, it.v)
		if err == nil {
			in = append(in, it)
		} else if !errors.Is(err, ErrFull) {
			t.Fatal(err)
		}
	}
	checkAll(t, s, countItems(in), "after the delete")
}

// countItems returns the multiset of items.
func countItems(items []item) map[item]int {
	m := map[item]int{}
	for _, it := range items {
		m[it]++
	}
	return m
}

// TestGrowKeepsEverything doubles a loaded shard until it saturates and
// checks after every doubling that a fresh lookup finds every item, with
// deletes in between.
func TestGrowKeepsEverything(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 2))
	s := mustNew(t, 4)
	model := map[item]int{}
	var keys []item
	for g := 0; ; g++ {
		// Fill to about 90%.
		for s.LoadFactor() < 0.9 {
			it := randomItem(r)
			if err := s.Insert(it.f, it.v); err != nil {
				break
			}
			if model[it] == 0 {
				keys = append(keys, it)
			}
			model[it]++
		}
		// Delete a few.
		for range len(keys) / 10 {
			i := r.IntN(len(keys))
			it := keys[i]
			if !s.Delete(it.f, it.v) {
				t.Fatalf("Delete(%+v) = false", it)
			}
			if model[it]--; model[it] == 0 {
				delete(model, it)
				keys[i] = keys[len(keys)-1]
				keys = keys[:len(keys)-1]
			}
		}
		checkAll(t, s, model, "before doubling")
		err := s.Grow()
		if errors.Is(err, ErrSaturated) {
			if g != InitialTailBits {
				t.Fatalf("saturated after %d doublings, want %d", g, InitialTailBits)
			}
			if st := s.Stats(); st.TailBits != 0 || st.Doublings != InitialTailBits {
				t.Fatalf("saturated shard: %+v", st)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		checkAll(t, s, model, "after doubling")
	}
}

// TestGrowFromDoublesOnce checks that two callers that saw the same full
// shard double it once.
func TestGrowFromDoublesOnce(t *testing.T) {
	s := mustNew(t, 3)
	d := s.Doublings()
	if ok, err := s.GrowFrom(d); !ok || err != nil {
		t.Fatalf("GrowFrom(%d) = %v, %v; want true, nil", d, ok, err)
	}
	if ok, err := s.GrowFrom(d); ok || err != nil {
		t.Fatalf("second GrowFrom(%d) = %v, %v; want false, nil", d, ok, err)
	}
	if got := s.Stats().Buckets; got != 16 {
		t.Fatalf("Buckets = %d, want 16", got)
	}
	if started, err := s.BeginGrow(); !started || err != nil {
		t.Fatalf("BeginGrow() = %v, %v; want true, nil", started, err)
	}
	if started, err := s.BeginGrow(); started || err != nil {
		t.Fatalf("second BeginGrow() = %v, %v; want false, nil (already growing)", started, err)
	}
	if !s.Growing() || s.NextGrowBytes() != 0 {
		t.Fatalf("Growing() = %v, NextGrowBytes() = %d during a doubling", s.Growing(), s.NextGrowBytes())
	}
	for !s.GrowStep(3) {
	}
	if s.Growing() || s.Stats().Buckets != 32 || s.Doublings() != 2 {
		t.Fatalf("after the steps: %+v", s.Stats())
	}
}

// TestStress runs GOMAXPROCS writers, churners and lock-free readers on one
// small shard that fills, kicks and doubles. A reader that checks an item
// whose insert completed before the check began must find it.
//
// The work is sized from what the test checks, not from the core count:
// the writers share stressItems items, enough to double the shard from 2^6
// buckets 8 times and fill it to a load of about 0.92 while they race, and the
// churners share stressChurn held items. More goroutines split the same
// work more ways, so the test means the same at every GOMAXPROCS (and an
// insert that meets a real limit, ErrSaturated, still fails it loudly).
func TestStress(t *testing.T) {
	seed := testSeed(t)
	procs := max(runtime.GOMAXPROCS(0), 2)
	total := stressItems
	if testing.Short() {
		total = stressItems / 6
	}
	perWriter := total / procs
	perChurner := max(stressChurn/procs, 1)
	s := mustNew(t, 6)

	// Writer w inserts items[w][0..], publishing in done[w] how many are in.
	items := make([][]item, procs)
	done := make([]atomic.Int64, procs)
	for w := range items {
		r := rand.New(rand.NewPCG(seed, uint64(w)+10))
		items[w] = make([]item, perWriter)
		for i := range items[w] {
			items[w][i] = randomItem(r)
		}
	}
	insert := func(it item) error {
		for {
			d := s.Doublings()
			err := s.Insert(it.f, it.v)
			if !errors.Is(err, ErrFull) {
				return err
			}
			if _, err := s.GrowFrom(d); err != nil {
				return err
			}
		}
	}

	var wg sync.WaitGroup
	stop := make(chan struct{})
	errc := make(chan error, 4*procs)
	for w := range procs {
		wg.Go(func() { // writer
			for i, it := range items[w] {
				if err := insert(it); err != nil {
					errc <- err
					return
				}
				done[w].Store(int64(i + 1))
			}
		})
	}
	var churned atomic.Int64
	for c := range procs {
		wg.Go(func() { // churner: inserts and deletes its own items, forcing moves
			r := rand.New(rand.NewPCG(seed, uint64(c)+1000))
			var mine []item
			for {
				select {
				case <-stop:
					return
				default:
				}
				if len(mine) < perChurner && r.IntN(2) == 0 {
					it := randomItem(r)
					if err := insert(it); err != nil {
						errc <- err
						return
					}
					mine = append(mine, it)
				} else if len(mine) > 0 {
					it := mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					if !s.Delete(it.f, it.v) {
						errc <- errors.New("churner: Delete of an inserted item returned false")
						return
					}
				}
				churned.Add(1)
			}
		})
	}
	var steps atomic.Int64
	wg.Go(func() { // grower: doubles in small steps, as package resize does
		for {
			select {
			case <-stop:
				return
			default:
			}
			if s.LoadFactor() >= 0.7 {
				if _, err := s.BeginGrow(); err != nil && !errors.Is(err, ErrSaturated) {
					errc <- err
					return
				}
			}
			if s.Growing() {
				s.GrowStep(1)
				steps.Add(1)
			} else {
				runtime.Gosched()
			}
		}
	})
	var readers sync.WaitGroup
	var checks atomic.Int64
	for rd := range procs {
		readers.Go(func() { // reader
			r := rand.New(rand.NewPCG(seed, uint64(rd)+2000))
			for {
				select {
				case <-stop:
					return
				default:
				}
				w := r.IntN(procs)
				n := done[w].Load()
				if n == 0 {
					continue
				}
				it := items[w][r.Int64N(n)]
				if !s.Contains(it.f, it.v) {
					errc <- errors.New("reader: false negative for an item whose insert had completed")
					return
				}
				checks.Add(1)
			}
		})
	}
	writersDone := make(chan struct{})
	go func() {
		// Writers finish on their own; churners and readers run until then.
		for w := range procs {
			for done[w].Load() < int64(perWriter) {
				select {
				case err := <-errc:
					errc <- err
					close(writersDone)
					return
				default:
					runtime.Gosched()
				}
			}
		}
		close(writersDone)
	}()
	<-writersDone
	close(stop)
	wg.Wait()
	readers.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for w := range procs {
		for _, it := range items[w] {
			if !s.Contains(it.f, it.v) {
				t.Fatalf("false negative for %+v after the run", it)
			}
		}
	}
	st := s.Stats()
	t.Logf("%d reader checks, %d churn ops, %d doublings, %d background steps, %d read retries, load %.3f",
		checks.Load(), churned.Load(), st.Doublings, steps.Load(), st.ReadRetries, st.LoadFactor)
	if st.Doublings == 0 {
		t.Errorf("the shard never doubled; the stress test did not exercise Grow")
	}
}

// Sizes of TestStress: the writers' items together, and the items the
// churners hold at most together. With 2^6 buckets and 8 doublings the
// shard holds 65,536 slots; the two leave it about 8% of them free.
const (
	stressItems = 60_000
	stressChurn = 128
)

// TestFPRAfterDoublings fills a shard to load 0.9, measures its
// false-positive rate on absent items, doubles it, fills it to 0.9 again,
// and so on until it saturates. After g doublings the rate must be within
// 1.5× of 8·load/2^(16−g) (EstimatedFPR, which uses the exact fingerprint
// collision probability).
func TestFPRAfterDoublings(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 3))
	s := mustNew(t, 10)
	probes := 1_000_000
	if testing.Short() {
		probes = 200_000
	}
	for g := 0; ; g++ {
		for s.LoadFactor() < 0.9 {
			it := randomItem(r)
			if err := s.Insert(it.f, it.v); err != nil {
				t.Fatal(err)
			}
		}
		// Probe items with fresh random bits; inserted ones are negligible
		// among 2^40 possible items.
		fp := 0
		for range probes {
			it := randomItem(r)
			if s.Contains(it.f, it.v) {
				fp++
			}
		}
		st := s.Stats()
		got := float64(fp) / float64(probes)
		want := EstimatedFPR(st.LoadFactor, st.TailBits)
		t.Logf("doublings=%d load=%.3f measured FPR %.3g, 8·load/2^(16-g) = %.3g", g, st.LoadFactor, got, want)
		if got > 1.5*want || got < want/1.5 {
			t.Errorf("after %d doublings: measured FPR %.3g, want within 1.5× of %.3g", g, got, want)
		}
		if err := s.Grow(); errors.Is(err, ErrSaturated) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
	}
}
