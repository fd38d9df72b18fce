package shard

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// TestLockFreeWritesRaceMoves races the writes that take no lock
// (insertFast, deleteFast) against everything that moves entries or
// holds the gate, on the same buckets: the items' first buckets are a
// half of the table, so that lock-free inserts and deletes land in the
// buckets that evictions empty and fill; churners keep the shard nearly
// full, so that most of their inserts evict; a grower doubles the shard,
// one bucket per step, whenever an insert finds no room, while the
// others write; a snapshotter
// encodes the shard and decodes the encoding. Fillers add items that stay
// and publish them; readers and the snapshotter check that every
// published item is present, in the shard and in every snapshot taken
// after it was published. It also checks the counts at the end.
func TestLockFreeWritesRaceMoves(t *testing.T) {
	seed := testrand.Seed(t)
	procs := max(runtime.GOMAXPROCS(0), 2)
	// Stable items fill 2^11 buckets to 0.92 (5 doublings from 2^6),
	// then the churners run on for churnOps, and at least until the grower
	// has doubled the shard 4 more times.
	stableTotal, churnOps := 7500, int64(300_000)
	if testing.Short() {
		stableTotal, churnOps = 1880, 50_000 // 2^9 buckets
	}
	s := mustNew(t, 6)
	givenUp0 := pathsGivenUp.Load()
	// hot makes an item's first position start with 0, so that first
	// buckets crowd half the table at every size.
	hot := func(it item) item {
		it.v &^= 1 << 63
		return it
	}

	var (
		mu     sync.Mutex // protects stable
		stable []item
		pub    atomic.Int64 // len(stable), published after the append
	)
	snapshotOf := func() []item {
		mu.Lock()
		defer mu.Unlock()
		return stable[:pub.Load()]
	}
	stop := make(chan struct{})
	errc := make(chan error, 8*procs)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	var workers, fillers sync.WaitGroup
	var churned, ownDeletes atomic.Int64
	var wantRoom atomic.Bool // an insert found no room: the grower doubles
	var filled atomic.Bool   // the fillers are done: no more doublings
	var afterFill atomic.Int64

	// Fillers: lock-free inserts of items that stay, until stableTotal.
	for w := range procs {
		fillers.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)+100))
			for n := 0; n < stableTotal/procs; {
				select {
				case <-stop:
					return
				default:
				}
				it := hot(randomItem(r))
				switch err := s.Insert(it.f, it.v); {
				case errors.Is(err, ErrFull):
					if s.LoadFactor() > 0.85 {
						wantRoom.Store(true) // else a crowd: skip the item
					}
					runtime.Gosched() // the grower makes room
					continue
				case errors.Is(err, ErrTooManyCopies):
					continue
				case err != nil:
					fail(err)
					return
				}
				mu.Lock()
				stable = append(stable, it)
				pub.Store(int64(len(stable)))
				mu.Unlock()
				n++
			}
		})
	}
	// Churners: insert and delete items of their own on the same buckets,
	// each holding the last few it inserted and checking one of them
	// after every write.
	for c := range procs {
		workers.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(c)+200))
			var held [16]item
			for n := 0; ; n++ {
				select {
				case <-stop:
					for _, it := range held[:min(n, len(held))] {
						if !s.Delete(it.f, it.v) {
							fail(fmt.Errorf("churner: Delete of held %+v found nothing", it))
						}
					}
					return
				default:
				}
				slot := &held[n%len(held)]
				if n >= len(held) {
					if !s.Delete(slot.f, slot.v) {
						fail(fmt.Errorf("churner: Delete of held %+v found nothing", *slot))
						return
					}
					ownDeletes.Add(1)
				}
				for {
					it := hot(randomItem(r))
					err := s.Insert(it.f, it.v)
					if err == nil {
						*slot = it
						break
					}
					if !errors.Is(err, ErrFull) && !errors.Is(err, ErrTooManyCopies) {
						fail(err)
						return
					}
					runtime.Gosched()
				}
				churned.Add(1)
				if filled.Load() {
					afterFill.Add(1)
				}
				if it := held[r.IntN(min(n+1, len(held)))]; !s.Contains(it.f, it.v) {
					fail(fmt.Errorf("churner: false negative for held %+v", it))
					return
				}
			}
		})
	}
	for range 0 {
		workers.Go(func() {
			r := rand.New(rand.NewPCG(seed, 0))
			for {
				select {
				case <-stop:
					return
				default:
				}
				it := hot(randomItem(r))
				if err := s.Insert(it.f, it.v); err != nil {
					if errors.Is(err, ErrFull) {
						runtime.Gosched()
						continue
					}
					if errors.Is(err, ErrTooManyCopies) {
						continue
					}
					fail(err)
					return
				}
				churned.Add(1)
				if filled.Load() {
					afterFill.Add(1)
				}
				if !s.Delete(it.f, it.v) {
					fail(fmt.Errorf("churner: Delete of inserted %+v found nothing", it))
					return
				}
				ownDeletes.Add(1)
			}
		})
	}
	// Readers: every published item is present.
	for c := range procs {
		workers.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(c)+300))
			for {
				select {
				case <-stop:
					return
				default:
				}
				items := snapshotOf()
				if len(items) == 0 {
					runtime.Gosched()
					continue
				}
				it := items[r.IntN(len(items))]
				if !s.Contains(it.f, it.v) {
					fail(fmt.Errorf("reader: false negative for %+v (%d items published, %+v)", it, len(items), s.Stats()))
					return
				}
			}
		})
	}
	// Grower: a doubling whenever an insert found no room (the shard is
	// full: most inserts before it evicted), while everyone writes.
	var grown atomic.Int64
	lateDoublings := int64(9) // 5 to fill, then 4
	if testing.Short() {
		lateDoublings = 5
	}
	workers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Once filled, a few more doublings at falling loads, where
			// inserts find room and do not finish the doubling for it:
			// lock-free writers run throughout these.
			late := filled.Load() && grown.Load() < lateDoublings
			if !wantRoom.Load() && !late {
				runtime.Gosched()
				continue
			}
			wantRoom.Store(false)
			// One bucket per step, yielding between steps, so that the
			// writers run while the doubling is half done.
			if _, err := s.beginGrow(); err != nil {
				fail(err)
				return
			}
			for !s.GrowStep(1) {
				runtime.Gosched()
			}
			grown.Add(1)
		}
	})
	// Snapshotter: an encoding holds every item published before it began.
	var snaps atomic.Int64
	workers.Go(func() {
		var buf bytes.Buffer
		for {
			select {
			case <-stop:
				return
			default:
			}
			items := snapshotOf()
			buf.Reset()
			if _, err := s.WriteTo(&buf); err != nil {
				fail(err)
				return
			}
			c := new(Shard)
			if err := c.Init(1); err != nil {
				fail(err)
				return
			}
			if _, err := c.ReadFrom(&buf); err != nil {
				fail(fmt.Errorf("snapshot: %w", err))
				return
			}
			for _, it := range items {
				if !c.Contains(it.f, it.v) {
					fail(fmt.Errorf("snapshot: false negative for %+v", it))
					return
				}
			}
			snaps.Add(1)
			runtime.Gosched()
		}
	})

	fillers.Wait()
	filled.Store(true)
	for afterFill.Load() < churnOps || grown.Load() < lateDoublings {
		runtime.Gosched()
	}
	close(stop)
	workers.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for _, it := range stable {
		if !s.Contains(it.f, it.v) {
			t.Fatalf("after the race: false negative for %+v", it)
		}
	}
	st := s.Stats()
	if st.Items != len(stable) {
		t.Errorf("Stats().Items = %d, want %d (the items that stayed)", st.Items, len(stable))
	}
	if want := int(churned.Load()) + len(stable); int(st.Inserts) != want {
		t.Errorf("Stats().Inserts = %d, want %d", st.Inserts, want)
	}
	occupied := 0
	tb := s.tab.Load()
	for b := range tb.buckets {
		occupied += countSlots(tb.load(uint64(b)))
	}
	occupied += int(tb.stashN.Load())
	if st.Copies != occupied {
		t.Errorf("Stats().Copies = %d, want the %d occupied slots", st.Copies, occupied)
	}
	s.mu.Lock()
	searches := s.searches
	s.mu.Unlock()
	t.Logf("%d stable items, %d churned, %d doublings, %d snapshots, load %.3f, %d eviction searches, %d paths given up, %d read retries, %d stashed",
		len(stable), churned.Load(), grown.Load(), snaps.Load(), st.LoadFactor, searches, pathsGivenUp.Load()-givenUp0, st.ReadRetries, st.Stashed)
}

// TestLockFreeCopiesRace inserts copies of one item from several
// goroutines at once, lock-free, into a shard where the item's buckets
// have room for all of them: no more than MaxCopies may stay.
func TestLockFreeCopiesRace(t *testing.T) {
	procs := max(runtime.GOMAXPROCS(0), 2) * 2
	for round := range 200 {
		s := mustNew(t, 4)
		it := item{f: uint8(round%255 + 1), v: uint64(round) << 58}
		var ready, done sync.WaitGroup
		start := make(chan struct{})
		var kept atomic.Int64
		for range procs {
			ready.Add(1)
			done.Go(func() {
				ready.Done()
				<-start
				if err := s.Insert(it.f, it.v); err == nil {
					kept.Add(1)
				} else if !errors.Is(err, ErrTooManyCopies) {
					t.Error(err)
				}
			})
		}
		ready.Wait()
		close(start)
		done.Wait()
		if n := kept.Load(); n > MaxCopies || n == 0 {
			t.Fatalf("round %d: %d inserts of one item kept, want 1 to %d", round, n, MaxCopies)
		}
		if got := s.Len(); got != int(kept.Load()) {
			t.Fatalf("round %d: Len() = %d, want %d", round, got, kept.Load())
		}
	}
}

// TestLockFreeWritesRaceKicks keeps a tiny shard (32 buckets) nearly
// full, so that almost every insert that takes the mutex evicts along a
// path that crosses much of the table, while the other goroutines' inserts
// that find a free slot, and their deletes, land lock-free in the same
// buckets. Each goroutine holds a ring of items it inserted and checks,
// after every write, that one of them, and now and then all of them, are
// present: an insert overwritten by an eviction, or an entry lost by a
// path carried out over a delete, is a false negative here.
func TestLockFreeWritesRaceKicks(t *testing.T) {
	seed := testrand.Seed(t)
	procs := max(runtime.GOMAXPROCS(0), 2)
	ops := 400_000 // shared by the goroutines whatever GOMAXPROCS
	if testing.Short() {
		ops = 60_000
	}
	s := mustNew(t, 5)
	ring := 118 / procs // the goroutines hold 0.92 of the 128 slots
	givenUp0 := pathsGivenUp.Load()
	var wg sync.WaitGroup
	errc := make(chan error, procs)
	for g := range procs {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)+500))
			held := make([]item, 0, ring)
			for i := range ops / procs {
				if len(held) == ring {
					it := held[0]
					held = append(held[:0], held[1:]...)
					if !s.Delete(it.f, it.v) {
						errc <- fmt.Errorf("Delete of held %+v found nothing", it)
						return
					}
				} else {
					it := randomItem(r)
					switch err := s.Insert(it.f, it.v); {
					case err == nil:
						held = append(held, it)
					case errors.Is(err, ErrFull), errors.Is(err, ErrTooManyCopies):
					default:
						errc <- err
						return
					}
				}
				if len(held) == 0 {
					continue
				}
				check := held[r.IntN(len(held)):][:1]
				if i%64 == 0 {
					check = held
				}
				for _, it := range check {
					if !s.Contains(it.f, it.v) {
						errc <- fmt.Errorf("false negative for held %+v after %d operations", it, i)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st := s.Stats()
	s.mu.Lock()
	searches := s.searches
	s.mu.Unlock()
	t.Logf("load %.3f, %d eviction searches, %d paths given up, %d read retries, %d stashed",
		st.LoadFactor, searches, pathsGivenUp.Load()-givenUp0, st.ReadRetries, st.Stashed)
}
