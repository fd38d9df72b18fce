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

// TestFullShardLosesNothing fills a shard until inserts fail many times in a
// row and checks that every item stored before is still found.
func TestFullShardLosesNothing(t *testing.T) {
	seed := testrand.Seed(t)
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

// TestMovesBumpStripes checks the write side of the lookup protocol: an
// insert that evicts moves entries along a path, and every bucket whose
// entries changed that way had its stripe bumped (odd during the move,
// even after), so that a lookup that read the bucket an entry moved into
// before the move, and the one it left after, retries instead of trusting
// its miss. A plain insert into a free slot changes one bucket and bumps
// nothing.
func TestMovesBumpStripes(t *testing.T) {
	r := rand.New(rand.NewPCG(testrand.Seed(t), 5))
	s := mustNew(t, 4)
	paths := 0
	for range 2000 {
		tb := s.tab.Load()
		before := append([]uint64(nil), tb.buckets...)
		var vers [stripes]uint64
		for i := range vers {
			vers[i] = s.vers[i].Load()
		}
		it := randomItem(r)
		if err := s.Insert(it.f, it.v); errors.Is(err, ErrFull) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var changed []uint64
		for b := range before {
			if tb.buckets[b] != before[b] {
				changed = append(changed, uint64(b))
			}
		}
		if len(changed) < 2 {
			if s.vers.sum() != sumOf(vers) {
				t.Fatalf("a plain insert bumped stripes")
			}
			continue
		}
		paths++
		for _, b := range changed {
			st := stripeOf(b)
			if got := s.vers[st].Load(); got == vers[st] || got&1 != 0 {
				t.Fatalf("a move through bucket %d left its stripe %d at %d (was %d)", b, st, got, vers[st])
			}
		}
	}
	if paths == 0 {
		t.Fatal("no insert evicted anything; the test checked nothing")
	}
	t.Logf("%d inserts moved entries along a path", paths)
}

func sumOf(vs [stripes]uint64) uint64 {
	var n uint64
	for _, v := range vs {
		n += v
	}
	return n
}

// TestFullShardStopsWalking checks that once an eviction walk has failed,
// inserts that would need one fail at once, without searching again (a
// search reads up to maxPathNodes buckets under the shard's lock, for
// every retry of a writer on a full shard), until a delete makes room.
func TestFullShardStopsWalking(t *testing.T) {
	r := rand.New(rand.NewPCG(testrand.Seed(t), 4))
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
		searches := s.searches
		it := randomItem(r)
		if err := s.Insert(it.f, it.v); !errors.Is(err, ErrFull) {
			if err != nil {
				t.Fatal(err)
			}
			in = append(in, it) // a free slot in one of its buckets
			continue
		}
		if s.searches != searches {
			walked++
		}
	}
	if walked != 0 {
		t.Fatalf("%d of the inserts into a full shard walked again", walked)
	}
	// A delete makes room, so the next insert that finds no free slot in
	// its buckets walks again. An insert that lands in the freed slot
	// fills the shard again without a walk (and then nothing would walk):
	// delete another item and try again.
	walkedAgain := false
	for range 1000 {
		if !s.Delete(in[0].f, in[0].v) {
			t.Fatal("Delete of an inserted item failed")
		}
		in = in[1:]
		searches := s.searches
		it := randomItem(r)
		err := s.Insert(it.f, it.v)
		if err == nil {
			in = append(in, it)
		} else if !errors.Is(err, ErrFull) {
			t.Fatal(err)
		}
		if s.searches != searches {
			walkedAgain = true
			break
		}
		if err != nil {
			t.Fatal("an insert into a shard with room refused without walking")
		}
	}
	if !walkedAgain {
		t.Fatal("no insert walked again after 1000 deletes")
	}
	checkAll(t, s, countItems(in), "after the delete")
}

// TestKickStress keeps a shard that never grows near full, so that almost
// every insert evicts along a path, while churners insert and delete
// items of their own and readers look up the items that stay: each path
// moves stable items under the readers' feet. A stable item must never
// read absent.
func TestKickStress(t *testing.T) {
	seed := testrand.Seed(t)
	r := rand.New(rand.NewPCG(seed, 6))
	procs := max(runtime.GOMAXPROCS(0), 2)
	churnOps := 400_000 // shared by the churners whatever GOMAXPROCS
	if testing.Short() {
		churnOps = 50_000
	}
	s := mustNew(t, 10)
	var stable []item
	for s.LoadFactor() < 0.92 {
		it := randomItem(r)
		if err := s.Insert(it.f, it.v); err != nil {
			t.Fatal(err)
		}
		stable = append(stable, it)
	}
	stop := make(chan struct{})
	errc := make(chan error, 2*procs)
	var churners, readers sync.WaitGroup
	var checks atomic.Int64
	for c := range procs {
		churners.Go(func() {
			if err := churn(s, rand.New(rand.NewPCG(seed, uint64(c)+3000)), churnOps/procs); err != nil {
				errc <- err
			}
		})
		readers.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(c)+4000))
			for {
				select {
				case <-stop:
					return
				default:
				}
				it := stable[r.IntN(len(stable))]
				if !s.Contains(it.f, it.v) {
					errc <- fmt.Errorf("reader: false negative for %+v while entries moved", it)
					return
				}
				checks.Add(1)
			}
		})
	}
	churners.Wait()
	close(stop)
	readers.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st := s.Stats()
	t.Logf("%d reader checks, %d read retries, load %.3f, %d stashed", checks.Load(), st.ReadRetries, st.LoadFactor, st.Stashed)
}

// churn inserts and deletes ops random items of r in s, one after the
// other: in a full shard every insert evicts. An insert refused with
// ErrFull is skipped; any other error, or a Delete that finds no item it
// inserted, is returned.
func churn(s *Shard, r *rand.Rand, ops int) error {
	for range ops {
		it := randomItem(r)
		switch err := s.Insert(it.f, it.v); {
		case errors.Is(err, ErrFull):
			continue
		case err != nil:
			return err
		}
		if !s.Delete(it.f, it.v) {
			return errors.New("churner: Delete of an inserted item returned false")
		}
	}
	return nil
}
