package shard

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// item is what a caller hands a shard: a fingerprint and a position.
type item struct {
	f uint8
	v uint64
}

func randomItem(r *rand.Rand) item {
	return item{f: uint8(r.IntN(255) + 1), v: r.Uint64() & positionMask}
}

// itemGen draws items of which many share a fingerprint and a long prefix
// of their position with earlier ones, so that entries of different items
// overlap (one's tail a prefix of another's) and deletes must pick the
// right one, as they do between the keys of a large guard.
//
// A fraction pooled of the items (2/3 if 0) agree with a pooled item on 1
// to maxKeep position bits (all VirtualBits if 0: then some items are
// identical, and crowds of items that no doubling separates form).
type itemGen struct {
	r       *rand.Rand
	pooled  float64
	maxKeep int
	pool    []item
}

func (g *itemGen) next() item {
	if len(g.pool) == 0 || g.r.Float64() >= cmp.Or(g.pooled, 2.0/3) {
		it := randomItem(g.r)
		if len(g.pool) < 64 {
			g.pool = append(g.pool, it)
		}
		return it
	}
	base := g.pool[g.r.IntN(len(g.pool))]
	keep := 1 + g.r.IntN(cmp.Or(g.maxKeep, VirtualBits)) // position bits shared with base
	fresh := g.r.Uint64() & positionMask
	v := base.v&^(positionMask>>keep) | fresh&(positionMask>>keep)
	return item{f: base.f, v: v}
}

func mustNew(t testing.TB, k int) *Shard {
	t.Helper()
	s, err := New(k)
	if err != nil {
		t.Fatalf("New(%d): %v", k, err)
	}
	return s
}

// mustGrowth returns a growth policy or fails the test.
func mustGrowth(t testing.TB, threshold float64, maxBytes int64) *Growth {
	t.Helper()
	g, err := NewGrowth(threshold, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	return g
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
	if err := s.Insert(0, 1<<63); !errors.Is(err, ErrZeroFingerprint) {
		t.Fatalf("Insert(0, ...) = %v, want ErrZeroFingerprint", err)
	}
	if s.Delete(0, 1<<63) || s.Len() != 0 {
		t.Fatalf("Delete(0, ...) changed the shard")
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
// repeated inserts of the same item (refused past MaxCopies), deletes of
// inserted items, lookups and doublings, with items whose entries overlap.
// Half the rounds start small and never double, so that eviction walks,
// ErrFull, rollback and the stash happen; the other half double at the
// grow threshold (and on ErrFull) through at least 12 doublings, so that
// entries lose their whole tail and void entries are copied, split and
// deleted.
func TestModel(t *testing.T) {
	seed := testrand.Seed(t)
	r := rand.New(rand.NewPCG(seed, 0))
	rounds := 24
	if testing.Short() || testrand.Race {
		rounds = 6 // one goroutine: nothing for the race detector to see
	}
	var fulls, grows, stashed, voids, refused, maxDoublings int
	for round := range rounds {
		grow := round%2 == 0
		s := mustNew(t, 1+r.IntN(3))
		gen := &itemGen{r: r}
		model := map[item]int{}
		var keys []item
		ops := 4000 + r.IntN(4000)
		if grow {
			s = mustNew(t, 1)
			gen.pooled = 1.0 / 4 // fewer crowds, so that the shard fills and doubles
			ops = 100_000
		}
		for op := range ops {
			switch x := r.IntN(100); {
			case x < 50: // insert a new item, or repeat an existing one
				it := gen.next()
				if len(keys) > 0 && r.IntN(8) == 0 {
					it = keys[r.IntN(len(keys))]
				}
				err := s.Insert(it.f, it.v)
				if errors.Is(err, ErrTooManyCopies) {
					refused++
					if !s.Contains(it.f, it.v) || model[it] < 1 && !hasOverlap(model, it) {
						t.Fatalf("round %d op %d: ErrTooManyCopies for %+v, inserted %d times", round, op, it, model[it])
					}
					continue
				}
				if errors.Is(err, ErrFull) {
					if fulls++; fulls%16 == 1 {
						checkAll(t, s, model, "after ErrFull")
					}
					// As package resize does: double a full shard, not one
					// whose failure is a crowd of items that agree on more
					// bits than a doubling separates.
					if grow && s.LoadFactor() >= 0.5 {
						if err := s.Grow(); err != nil {
							t.Fatalf("Grow: %v", err)
						}
						grows++
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
				if grow && s.LoadFactor() >= 0.9 && !s.Growing() {
					if _, err := s.beginGrow(); err != nil {
						t.Fatalf("beginGrow: %v", err)
					}
				}
			case x < 75: // delete an inserted item
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
						t.Fatalf("round %d op %d: false negative for %+v (%d doublings)", round, op, it, s.Doublings())
					}
				}
			default: // advance a doubling by a small chunk
				if s.Growing() && s.GrowStep(1+r.IntN(8)) {
					grows++
				}
			}
			st := s.Stats()
			if st.Stashed > 0 {
				stashed++
			}
			voids = max(voids, st.Tails[0])
		}
		checkAll(t, s, model, "end of round")
		maxDoublings = max(maxDoublings, s.Doublings())
	}
	t.Logf("ErrFull %d times, %d doublings (at most %d in one round), %d ops with a nonempty stash, up to %d void entries, %d copies refused",
		fulls, grows, maxDoublings, stashed, voids, refused)
	if fulls == 0 || grows == 0 || stashed == 0 || voids == 0 || refused == 0 || maxDoublings < 12 {
		t.Errorf("the model test did not reach ErrFull (%d), the stash (%d), void entries (%d), refused copies (%d) and 12 doublings (%d)",
			fulls, stashed, voids, refused, maxDoublings)
	}
}

// hasOverlap reports whether the model holds an item other than it with
// its fingerprint: the copies that ErrTooManyCopies counts are identical
// slots, which distinct items with equal fingerprints and positions that
// agree on the bits the slot keeps also have.
func hasOverlap(model map[item]int, it item) bool {
	for m := range model {
		if m.f == it.f && m != it {
			return true
		}
	}
	return false
}

// TestTooManyCopies inserts one item again and again: past MaxCopies the
// shard refuses it without growing, and other items are still accepted.
func TestTooManyCopies(t *testing.T) {
	s := mustNew(t, 3)
	const f, v = 0x42, 0xdead_beef_00 << 24
	for i := range 1000 {
		err := s.Insert(f, v)
		switch {
		case i < MaxCopies && err != nil:
			t.Fatalf("insert %d: %v", i, err)
		case i >= MaxCopies && !errors.Is(err, ErrTooManyCopies):
			t.Fatalf("insert %d = %v, want ErrTooManyCopies", i, err)
		}
	}
	st := s.Stats()
	if st.Items != MaxCopies || st.Doublings != 0 || st.DuplicatesRefused != 1000-MaxCopies {
		t.Fatalf("after 1000 inserts of one item: %+v", st)
	}
	// The count is the shard's, not its table's: a doubling keeps it.
	if err := s.Grow(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.DuplicatesRefused != 1000-MaxCopies {
		t.Fatalf("after a doubling: %d inserts refused, want %d", st.DuplicatesRefused, 1000-MaxCopies)
	}
	r := rand.New(rand.NewPCG(7, 8))
	for range 20 {
		it := randomItem(r)
		if err := s.Insert(it.f, it.v); err != nil {
			t.Fatalf("another item: %v", err)
		}
	}
	for range MaxCopies {
		if !s.Delete(f, v) {
			t.Fatal("Delete of an inserted copy = false")
		}
	}
	if s.Contains(f, v) && s.Stats().Items != 20 {
		t.Fatalf("copies left after deleting them all: %+v", s.Stats())
	}
}

// TestDeleteLongestMatch checks the delete rule with two items whose
// entries overlap: y was inserted before three doublings (its entry keeps 4
// tail bits), z after them (7 bits), z's position agrees with y's on every
// bit y keeps. Deleting y must leave z found, whichever entry it takes.
func TestDeleteLongestMatch(t *testing.T) {
	s := mustNew(t, 4)
	const f = 0x77
	y := uint64(0xabcd_ef12_34) << 24
	if err := s.Insert(f, y); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Grow(); err != nil {
			t.Fatal(err)
		}
	}
	// z shares y's first 4+7 = 11 position bits, then differs.
	z := y ^ 1<<(63-13)
	if err := s.Insert(f, z); err != nil {
		t.Fatal(err)
	}
	if !s.Delete(f, y) || !s.Contains(f, z) {
		t.Fatalf("after deleting y, z reads absent")
	}
	if !s.Delete(f, z) || s.Len() != 0 {
		t.Fatalf("after deleting z: %+v", s.Stats())
	}
}

// countItems returns the multiset of items.
func countItems(items []item) map[item]int {
	m := map[item]int{}
	for _, it := range items {
		m[it]++
	}
	return m
}

// TestLenUnderChurn checks that Len and Stats().Items, read while
// writers insert and delete, stay within what the shard held: never
// negative, never above what the writers could have added.
func TestLenUnderChurn(t *testing.T) {
	const writers, rounds, held = 2, 20_000, 3
	s := mustNew(t, 4)
	var done atomic.Int32
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			defer done.Add(1)
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				var in [held]item
				for i := range in {
					in[i] = randomItem(r)
					if err := s.Insert(in[i].f, in[i].v); err != nil {
						t.Error(err)
						return
					}
				}
				for _, it := range in {
					if !s.Delete(it.f, it.v) {
						t.Errorf("Delete(%+v) = false after its Insert", it)
						return
					}
				}
			}
		})
	}
	for done.Load() < writers {
		if n, items := s.Len(), s.Stats().Items; n < 0 || n > writers*held || items < 0 || items > writers*held {
			t.Fatalf("Len() = %d, Stats().Items = %d, want each in [0, %d]", n, items, writers*held)
		}
	}
	wg.Wait()
	if n := s.Len(); n != 0 {
		t.Errorf("Len() = %d after every insert was deleted, want 0", n)
	}
}

// TestStress runs GOMAXPROCS writers, churners and lock-free readers on one
// small shard that fills, kicks and doubles. A reader that checks an item
// whose insert completed before the check began must find it.
//
// The work is sized from what the test checks, not from the core count:
// the writers share stressItems items, enough to double the shard from 2
// buckets 14 times (past the point where the first entries have no tail
// left and are copied at every doubling), and the churners share
// stressChurn held items. More goroutines split the same work more ways,
// so the test means the same at every GOMAXPROCS (and an insert that meets
// a real limit still fails it loudly).
func TestStress(t *testing.T) {
	seed := testrand.Seed(t)
	procs := max(runtime.GOMAXPROCS(0), 2)
	total := stressItems
	if testing.Short() {
		total = stressItems / 6
	}
	perWriter := total / procs
	perChurner := max(stressChurn/procs, 1)
	s := mustNew(t, 1)
	if err := s.SetGrowth(mustGrowth(t, DefaultGrowThreshold, 0)); err != nil {
		t.Fatal(err)
	}

	// Writer w tries cands[w] in order and records the items that are in
	// in items[w][0..], publishing in done[w] how many.
	cands := make([][]item, procs)
	items := make([][]item, procs)
	done := make([]atomic.Int64, procs)
	for w := range items {
		// Items whose entries overlap, some identical.
		gen := &itemGen{r: rand.New(rand.NewPCG(seed, uint64(w)+10)), pooled: 0.1}
		cands[w] = make([]item, perWriter)
		items[w] = make([]item, perWriter)
		for i := range cands[w] {
			cands[w][i] = gen.next()
		}
	}
	// Under its growth policy the shard doubles when an insert finds no
	// room, unless it is less than half full: the failure is then a
	// crowd of items that no doubling separates, which the writer skips.
	errCrowd := errors.New("crowd")
	insert := func(it item) error {
		if err := s.Insert(it.f, it.v); errors.Is(err, errFullCrowded) {
			return errCrowd
		} else {
			return err
		}
	}
	var crowded atomic.Int64

	var wg, writers sync.WaitGroup
	stop := make(chan struct{})
	errc := make(chan error, 4*procs)
	for w := range procs {
		writers.Go(func() { // writer
			in := 0
			for _, it := range cands[w] {
				// An item refused as one copy too many is present
				// already, which is all the readers check.
				switch err := insert(it); {
				case errors.Is(err, errCrowd):
					crowded.Add(1)
					continue
				case err != nil && !errors.Is(err, ErrTooManyCopies):
					errc <- err
					return
				}
				items[w][in] = it
				in++
				done[w].Store(int64(in))
				if in%4096 == 0 {
					runtime.Gosched() // readers run between writes at GOMAXPROCS=1 too
				}
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
					switch err := insert(it); {
					case errors.Is(err, errCrowd), errors.Is(err, ErrTooManyCopies):
						continue // not added: not to be deleted
					case err != nil:
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
				if _, err := s.beginGrow(); err != nil && !errors.Is(err, ErrSaturated) {
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
	// Writers finish on their own (or on an error); churners and readers
	// run until then.
	writers.Wait()
	close(stop)
	wg.Wait()
	readers.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for w := range procs {
		for _, it := range items[w][:done[w].Load()] {
			if !s.Contains(it.f, it.v) {
				t.Fatalf("false negative for %+v after the run", it)
			}
		}
	}
	st := s.Stats()
	t.Logf("%d reader checks, %d churn ops, %d doublings, %d background steps, %d read retries, load %.3f, %d void copies, %d crowded items skipped",
		checks.Load(), churned.Load(), st.Doublings, steps.Load(), st.ReadRetries, st.LoadFactor, st.Tails[0], crowded.Load())
	if want := 12; st.Doublings < want && !testing.Short() {
		t.Errorf("the shard doubled %d times; the stress test should double it at least %d times", st.Doublings, want)
	}
	if st.Doublings == 0 {
		t.Errorf("the shard never doubled; the stress test did not exercise Grow")
	}
}

// Sizes of TestStress: the writers' items together, and the items the
// churners hold at most together.
const (
	stressItems = 60_000
	stressChurn = 128
)

// TestStashDrainInvalidatesMisses checks the seqlock's rule for the one
// move that did not follow it: a drain of the stash (after a delete made
// room) that puts an entry back into the bucket it was filed under. An
// entry parked by an eviction path is filed under its alternate bucket,
// which may be the item's second bucket; a lookup validates with the
// stripe of its first. A lookup that read both buckets before the drain
// and the stash after it saw the entry nowhere, and it may trust that
// miss only if its stripe changed: the drain must bump the stripes of
// both of the entry's buckets, not only the one it lands in. Before the
// fix it bumped that one alone, and the miss was trusted: a false
// negative of a present item (and a lock-free delete could take the less
// specific entry of another item instead of the item's own).
func TestStashDrainInvalidatesMisses(t *testing.T) {
	r := rand.New(rand.NewPCG(testrand.Seed(t), 0))
	checked := 0
	for checked < 200 {
		s, err := New(6)
		if err != nil {
			t.Fatal(err)
		}
		tab := s.tab.Load()
		f := uint8(1 + r.IntN(255))
		v := r.Uint64()
		b1, _, b2, s2 := tab.slots(f, v, alt(f))
		if stripeOf(b1) == stripeOf(b2) {
			continue // the stripe it validates with is bumped either way
		}
		// The item's entry parked in the stash under its second bucket, as
		// a failed eviction path parks the entry it takes out of the first.
		s.mu.Lock()
		tab.stashAdd(b2, s2)
		s.mu.Unlock()
		if !s.Contains(f, v) {
			t.Fatal("a stashed item reads absent")
		}
		// A lookup: its stripe, then its two buckets (the entry is in
		// neither)...
		st := stripeOf(b1)
		ver := s.vers[st].Load()
		if hasItem(tab, b1, b2, f, v) {
			t.Fatal("the entry is in a bucket before the drain")
		}
		// ...the drain moves the entry into b2...
		s.mu.Lock()
		s.drainStashLocked(tab)
		s.mu.Unlock()
		if tab.stashN.Load() != 0 || !hasItem(tab, b1, b2, f, v) {
			t.Fatal("the drain did not move the entry into its bucket")
		}
		// ...and the lookup then finds the stash empty. It must not trust
		// its miss.
		if s.vers.stable(st, ver) {
			t.Fatalf("a drain from the stash into bucket %d left the stripe of bucket %d unchanged: a lookup that read both buckets before it and the stash after it trusts a miss of a present item", b2, b1)
		}
		checked++
	}
}

// hasItem reports whether bucket b1 or b2 of t holds an entry that item
// (f, v) matches.
func hasItem(t *table, b1, b2 uint64, f uint8, v uint64) bool {
	_, p1, _, p2 := t.probes(f, v, alt(f))
	return matchLanes(t.load(b1), p1)|matchLanes(t.load(b2), p2) != 0
}
