package shard

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// batchOf looks up items in s (or in shards[i%len(shards)] if shards is not
// nil) with ContainsMany.
func batchOf(shards []*Shard, items []item) []bool {
	ss := make([]*Shard, len(items))
	fs := make([]uint8, len(items))
	vs := make([]uint64, len(items))
	for i, it := range items {
		ss[i], fs[i], vs[i] = shards[i%len(shards)], it.f, it.v
	}
	out := make([]bool, len(items))
	ContainsMany(ss, fs, vs, out)
	return out
}

// TestContainsManyAgrees checks that ContainsMany answers as Contains does,
// item for item, in shards of every state a lookup resolves differently:
// exact slots, slots of several tail lengths after doublings, a doubling
// half done (buckets on both sides of the cursor), and a stash; for
// batches of every length around the group size.
func TestContainsManyAgrees(t *testing.T) {
	seed := testrand.Seed(t)
	r := rand.New(rand.NewPCG(seed, 7))
	fresh := mustNew(t, 6)
	grown := mustNew(t, 2)
	if err := grown.SetGrowth(mustGrowth(t, DefaultGrowThreshold, 0)); err != nil {
		t.Fatal(err)
	}
	migrating := mustNew(t, 6)
	stashed := mustNew(t, 3)
	var present []item
	fill := func(s *Shard, n int) {
		for range n {
			it := randomItem(r)
			if err := s.Insert(it.f, it.v); err == nil {
				present = append(present, it)
			}
		}
	}
	fill(fresh, 200)
	fill(grown, 3000)
	fill(migrating, 230)
	if ok, err := migrating.beginGrow(); !ok || err != nil {
		t.Fatalf("beginGrow = %v, %v", ok, err)
	}
	migrating.GrowStep(len(migrating.tab.Load().buckets) / 2)
	for stashed.Stats().Stashed == 0 {
		fill(stashed, 1) // a table of 8 buckets stashes after a failed walk
	}
	if !migrating.Growing() || grown.Doublings() < 5 || grown.tab.Load().exact {
		t.Fatalf("shards not in the states tested: migrating %v, %d doublings, exact %v",
			migrating.Growing(), grown.Doublings(), grown.tab.Load().exact)
	}
	shards := []*Shard{fresh, grown, migrating, stashed}
	for _, n := range []int{0, 1, 2, BatchGroup - 1, BatchGroup, BatchGroup + 1, 2 * BatchGroup, 2*BatchGroup + 1, 257} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			items := make([]item, n)
			for i := range items {
				if r.IntN(2) == 0 && len(present) > 0 {
					items[i] = present[r.IntN(len(present))]
				} else {
					items[i] = randomItem(r)
				}
			}
			got := batchOf(shards, items)
			for i, it := range items {
				s := shards[i%len(shards)]
				if want := s.Contains(it.f, it.v); got[i] != want {
					t.Fatalf("item %d %+v: ContainsMany = %v, Contains = %v", i, it, got[i], want)
				}
			}
		})
	}
	// Every present item, each looked up in its own shard.
	var own []*Shard
	var items []item
	for _, s := range shards {
		for _, it := range present {
			if s.Contains(it.f, it.v) {
				own, items = append(own, s), append(items, it)
			}
		}
	}
	ss := make([]*Shard, len(items))
	fs := make([]uint8, len(items))
	vs := make([]uint64, len(items))
	for i, it := range items {
		ss[i], fs[i], vs[i] = own[i], it.f, it.v
	}
	out := make([]bool, len(items))
	ContainsMany(ss, fs, vs, out)
	for i, ok := range out {
		if !ok {
			t.Fatalf("present item %+v reads absent in a batch", items[i])
		}
	}
	if len(items) < len(present) {
		t.Fatalf("%d of %d present items found by Contains", len(items), len(present))
	}
}

func TestContainsManyDoesNotAllocate(t *testing.T) {
	s := mustNew(t, 8)
	n := 3*BatchGroup + 5
	ss, fs, vs, out := make([]*Shard, n), make([]uint8, n), make([]uint64, n), make([]bool, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		it := randomItem(r)
		ss[i], fs[i], vs[i] = s, it.f, it.v
	}
	if a := testing.AllocsPerRun(100, func() { ContainsMany(ss, fs, vs, out) }); a != 0 {
		t.Fatalf("ContainsMany allocates %v times", a)
	}
}

// TestContainsManyStress is TestKickStress and the growth of TestStress
// with batch lookups: writers insert items into shards that double under
// them, churners insert and delete items of their own in full shards, so
// that every insert evicts along a path and moves stable items under the
// readers' feet, and readers look up batches of items whose inserts have
// completed. A batch reads an item's stripe version a whole group before
// its buckets, so it overlaps more moves than one Contains does: no item
// may ever read absent.
func TestContainsManyStress(t *testing.T) {
	seed := testrand.Seed(t)
	procs := max(runtime.GOMAXPROCS(0), 2)
	total := stressItems
	churnOps := 400_000
	if testing.Short() {
		total, churnOps = stressItems/6, 50_000
	}
	// A full shard (moves) and a growing one (doublings, both tables).
	r := rand.New(rand.NewPCG(seed, 8))
	full := mustNew(t, 10)
	var stable []item
	for full.LoadFactor() < 0.92 {
		it := randomItem(r)
		if err := full.Insert(it.f, it.v); err != nil {
			t.Fatal(err)
		}
		stable = append(stable, it)
	}
	growing := mustNew(t, 1)
	if err := growing.SetGrowth(mustGrowth(t, DefaultGrowThreshold, 0)); err != nil {
		t.Fatal(err)
	}
	grownItems := make([]item, total)
	var grownDone atomic.Int64

	stop := make(chan struct{})
	errc := make(chan error, 4*procs)
	var writers, others, readers sync.WaitGroup
	writers.Go(func() { // inserts into the growing shard, which doubles itself
		gen := &itemGen{r: rand.New(rand.NewPCG(seed, 9)), pooled: 0.1}
		n := 0
		for range total {
			it := gen.next()
			switch err := growing.Insert(it.f, it.v); {
			case errors.Is(err, errFullCrowded):
				continue // a crowd no doubling separates: not added
			case err != nil && !errors.Is(err, ErrTooManyCopies):
				errc <- err
				return
			}
			grownItems[n] = it
			n++
			grownDone.Store(int64(n))
			if n%4096 == 0 {
				runtime.Gosched()
			}
		}
	})
	for c := range procs {
		writers.Go(func() { // churns the full shard: every insert evicts
			if err := churn(full, rand.New(rand.NewPCG(seed, uint64(c)+3000)), churnOps/procs); err != nil {
				errc <- err
			}
		})
	}
	others.Go(func() { // doubles the growing shard in small steps too, as package resize does
		for {
			select {
			case <-stop:
				return
			default:
			}
			if growing.Growing() {
				growing.GrowStep(1)
			} else {
				runtime.Gosched()
			}
		}
	})
	var batches atomic.Int64
	for rd := range procs {
		readers.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(rd)+4000))
			const most = 4*BatchGroup + 3
			ss, fs, vs, out := make([]*Shard, most), make([]uint8, most), make([]uint64, most), make([]bool, most)
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := 1 + r.IntN(most)
				done := grownDone.Load()
				for i := range n {
					s, it := full, stable[r.IntN(len(stable))]
					if done > 0 && r.IntN(2) == 0 {
						s, it = growing, grownItems[r.Int64N(done)]
					}
					ss[i], fs[i], vs[i] = s, it.f, it.v
				}
				ContainsMany(ss[:n], fs[:n], vs[:n], out[:n])
				for i := range n {
					if !out[i] {
						errc <- fmt.Errorf("reader: false negative in a batch for %+v (full shard: %v)", item{fs[i], vs[i]}, ss[i] == full)
						return
					}
				}
				batches.Add(1)
			}
		})
	}
	writers.Wait()
	close(stop)
	others.Wait()
	readers.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st, gs := full.Stats(), growing.Stats()
	t.Logf("%d batches; full shard: %d read retries, load %.3f; growing shard: %d doublings, %d read retries",
		batches.Load(), st.ReadRetries, st.LoadFactor, gs.Doublings, gs.ReadRetries)
	if gs.Doublings == 0 {
		t.Errorf("the growing shard never doubled")
	}
}

// TestContainsManyRetriesDuringMove checks the read side of the lookup
// protocol in a batch, where the stress tests rarely hit the window: an
// item's entry is in neither of its buckets for the moment a writer moves
// it between them, with their stripe odd. A batch that reads its buckets
// then must not trust the miss: it retries until the move has ended and
// finds the item.
func TestContainsManyRetriesDuringMove(t *testing.T) {
	r := rand.New(rand.NewPCG(testrand.Seed(t), 10))
	s := mustNew(t, 6)
	it := randomItem(r)
	if err := s.Insert(it.f, it.v); err != nil {
		t.Fatal(err)
	}
	tb := s.tab.Load()
	b1, _, b2, _ := tb.probes(it.f, it.v, alt(it.f))
	from := b1
	if countSlots(tb.buckets[b1]) == 0 {
		from = b2
	}
	sl := laneOf(tb.buckets[from], 0)
	to, tsl := tb.other(from, sl)

	var b Batch
	out := []bool{false}
	b.Start(out)
	b.Add(s, it.f, it.v) // reads the table and the stripe, not the buckets

	// The move begins: the stripes are odd and the entry has left its
	// bucket, not yet reached the other.
	s.mu.Lock()
	s.vers.open(from, to)
	storeBucket(tb, from, 0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Finish()
	}()
	// Wait until the batch has read the buckets in the middle of the move
	// and retried, or has answered without retrying.
	retried := false
	for !retried {
		select {
		case <-done:
			retried = true
		default:
			retried = s.retries.Load() > 0
			runtime.Gosched()
		}
	}
	tb.put(to, tsl)
	s.vers.close(from, to)
	s.mu.Unlock()
	<-done
	if !out[0] {
		t.Fatalf("a batch read %+v absent in the middle of a move and trusted it", it)
	}
	if s.retries.Load() == 0 {
		t.Fatalf("the batch answered without retrying")
	}
}
