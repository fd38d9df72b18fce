package guarded

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// oracleStore is a store whose rows carry an incarnation: a lookup that
// finds the same incarnation of a row before and after it saw a row that
// existed all along, which the Loader must not answer ErrNotFound for.
//
// Keys are unique, as a primary key is: an insert of a key whose row
// exists, or whose insert is still open (a write that returned
// ErrMaybeWritten and commits later holds it, as a database's row lock
// does), is refused as a duplicate.
type oracleStore struct {
	mu   sync.RWMutex
	rows map[int]uint64  // key → incarnation
	held map[int]bool    // keys of inserts not committed yet
	inc  uint64          // last incarnation; under mu
	late map[uint64]bool // incarnations a late commit made, for the report of a wrong 404
}

// create makes a row of k unless k is taken, and reports whether it did.
func (s *oracleStore) create(k int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.rows[k]; ok || s.held[k] {
		return false
	}
	s.inc++
	s.rows[k] = s.inc
	return true
}

// hold takes k for an insert that commits later, unless k is taken, and
// reports whether it did.
func (s *oracleStore) hold(k int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.rows[k]; ok || s.held[k] {
		return false
	}
	s.held[k] = true
	return true
}

// commit makes the row of k, which hold took.
func (s *oracleStore) commit(k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.held, k)
	s.inc++
	s.rows[k] = s.inc
	s.late[s.inc] = true
}

// lateCommitted reports whether a late commit made incarnation v.
func (s *oracleStore) lateCommitted(v uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.late[v]
}

func (s *oracleStore) remove(k int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.rows[k]
	delete(s.rows, k)
	return ok
}

// version returns the incarnation of k's row, 0 if there is none.
func (s *oracleStore) version(k int) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rows[k]
}

func (s *oracleStore) lookup(ctx context.Context, k int) (string, error) {
	if v := s.version(k); v != 0 {
		return fmt.Sprint(v), nil
	}
	return "", ErrNotFound
}

func (s *oracleStore) lookupMany(ctx context.Context, ks []int) (map[int]string, error) {
	m := make(map[int]string, len(ks))
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, k := range ks {
		if v, ok := s.rows[k]; ok {
			m[k] = fmt.Sprint(v)
		}
	}
	return m, nil
}

func (s *oracleStore) keys(ctx context.Context) iter.Seq2[int, error] {
	s.mu.RLock()
	ks := make([]int, 0, len(s.rows))
	for k := range s.rows {
		ks = append(ks, k)
	}
	s.mu.RUnlock()
	return func(yield func(int, error) bool) {
		for _, k := range ks {
			if !yield(k, nil) {
				return
			}
		}
	}
}

// writes tracks, per key (striped), the Loader writes in progress and how
// many have begun or ended, so that the oracle leaves out lookups that
// overlap a write of their key: a row that the write's store call made
// visible before the write returned may read absent until it returns
// (the lookup is concurrent with the write). A late commit is no write of
// the Loader's and leaves nothing out.
type writes struct {
	active  [1 << 12]atomic.Int32
	changes [1 << 12]atomic.Uint32
}

func (w *writes) begin(k int) {
	w.active[k%len(w.active)].Add(1)
	w.changes[k%len(w.changes)].Add(1)
}

func (w *writes) end(k int) {
	w.changes[k%len(w.changes)].Add(1)
	w.active[k%len(w.active)].Add(-1)
}

// mark returns what quiet needs, read before a lookup of k.
func (w *writes) mark(k int) (idle bool, changes uint32) {
	changes = w.changes[k%len(w.changes)].Load()
	return w.active[k%len(w.active)].Load() == 0, changes
}

// quiet reports whether no write of k was in progress at mark's call or
// began since.
func (w *writes) quiet(k int, idle bool, changes uint32) bool {
	return idle && w.changes[k%len(w.changes)].Load() == changes
}

// stressResult is what one stress run saw.
type stressResult struct {
	checked, wrong, late, ops int64
	addFailures               int64 // adds the memory cap refused, over the guards rebuilds replaced
	stats                     Stats
}

// errDuplicate is a unique violation: the server refused the insert.
var errDuplicate = fmt.Errorf("duplicate key: %w", ErrNotWritten)

// runStress runs writers that share a key space against a Loader over an
// oracleStore for d, with every outcome a write can have, rebuilds, the
// negative cache and a memory cap, and checks every lookup against the
// store: a key whose row was there, the same incarnation, before and
// after a Get or GetMany must not read ErrNotFound. opts are the Loader's
// options after the run's own (a mutation goes there).
func runStress(t *testing.T, seed uint64, d time.Duration, opts ...Option) stressResult {
	t.Helper()
	const keys = 2000      // shared by every writer
	const settle = 1 << 20 // of the fake clock; a rebuild advances it settle/4
	ctx := context.Background()
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	s := &oracleStore{rows: map[int]uint64{}, held: map[int]bool{}, late: map[uint64]bool{}}
	for k := range keys / 2 {
		s.create(k)
	}
	twin, err := guard.New(guard.WithCapacity(200), guard.WithShards(4), guard.WithSeed(seed))
	if err != nil {
		t.Fatal(err)
	}
	limit := twin.Stats().ReservedBytes * 5 / 4 // full long before the rows fit
	twin.Close()
	var addFailures atomic.Int64
	var lastOld atomic.Pointer[guard.Guard]
	lopts := append([]Option{
		withClock(now),
		WithNegativeCache(512, 1000*settle),
		WithUnsettled(256, settle),
		// Rebuilt guards keep a cap, with room for the rows.
		// Rebuilt guards keep a cap: 96 bits per key they are sized for,
		// and the fixed overhead (a layout of powers of two may need
		// 64), which their shards reach after doubling a few times.
		WithRebuildGuard(func(old *guard.Guard, n int) (*guard.Guard, error) {
			if lastOld.Swap(old) != old { // a failed rebuild tries the same guard again
				addFailures.Add(int64(old.Stats().AddFailures)) // adds the cap refused, in the guard replaced
			}
			return old.Fresh(n, guard.WithMaxBytes(16<<10+12*n))
		}),
	}, opts...)
	l := newTestLoader(t, Funcs[int, string]{Lookup: s.lookup, LookupMany: s.lookupMany, ListKeys: s.keys},
		[]guard.Option{guard.WithCapacity(200), guard.WithShards(4), guard.WithSeed(seed), guard.WithMaxBytes(limit)}, lopts...)

	var res stressResult
	var checked, wrong, late, ops atomic.Int64
	var generated atomic.Int64 // keys InsertGenerated made: keys, keys+1, …
	generated.Store(keys)
	// check looks ks up, with Get or GetMany, and counts the keys whose
	// row was there all along and the wrong 404s among them.
	var inFlight writes
	check := func(r *rand.Rand, ks ...int) {
		before := make([]uint64, len(ks))
		idle := make([]bool, len(ks))
		changes := make([]uint32, len(ks))
		for i, k := range ks {
			idle[i], changes[i] = inFlight.mark(k)
			before[i] = s.version(k)
		}
		errs := make([]error, len(ks))
		rebuildsBefore, viewBefore := l.rebuilds.Value(), l.cur.Load()
		how := "GetMany"
		if len(ks) == 1 && r.IntN(2) == 0 {
			how = "Get"
			_, errs[0] = l.Get(ctx, ks[0])
		} else {
			_, errs = l.GetMany(ctx, ks)
		}
		for i, k := range ks {
			if before[i] == 0 || s.version(k) != before[i] || !inFlight.quiet(k, idle[i], changes[i]) {
				continue
			}
			checked.Add(1)
			if errors.Is(errs[i], ErrNotFound) {
				if wrong.Add(1) <= 3 {
					st := l.Stats()
					t.Logf("wrong 404: key %d, row %d present before and after (rebuilds %d, unsettled %d, overflows %d, pass-through shards %d, negative-cache hits %d)",
						k, before[i], st.Rebuilds, st.Unsettled, st.UnsettledOverflows, st.PassThroughShards, st.NegativeCacheHits)
					// What the Loader holds of the key now, to tell which
					// answer was wrong: the guard's, the negative cache's
					// or the store call's.
					v := l.cur.Load()
					h := l.codec.hash(v.g, k)
					_, negEntry := l.neg.m.Load(k)
					t.Logf("wrong 404 of %d by %s of %d keys: row made by a late commit %v; rebuilds during the lookup %d (view replaced %v); now: guard holds it %v, shard passes %v, owed copies %v, negative-cache entry %v, unsettled %v, ready %v",
						k, how, len(ks), s.lateCommitted(before[i]), l.rebuilds.Value()-rebuildsBefore, v != viewBefore,
						v.g.ContainsHash(h), v.passes(h), v.over.any.Load(), negEntry, l.unsettled.mayShow(h, l.cfg.now), l.Ready())
				}
			} else if errs[i] != nil {
				t.Errorf("lookup of %d: %v", k, errs[i])
			}
		}
	}
	anyKey := func(r *rand.Rand) int { return r.IntN(int(generated.Load())) }

	// Writes whose commit comes late: the write returned ErrMaybeWritten
	// with its transaction still open, and it commits once two rebuilds
	// have finished since, so that at least one read the keys without it.
	type lateCommit struct {
		keys  []int
		after uint64
	}
	var lateMu sync.Mutex
	var pending []lateCommit
	var rebuilds atomic.Uint64
	deferCommit := func(ks ...int) {
		lateMu.Lock()
		pending = append(pending, lateCommit{keys: ks, after: rebuilds.Load() + 2})
		lateMu.Unlock()
	}
	commitLate := func(r *rand.Rand, all bool) {
		lateMu.Lock()
		var due []lateCommit
		kept := pending[:0]
		for _, c := range pending {
			if all || c.after <= rebuilds.Load() {
				due = append(due, c)
			} else {
				kept = append(kept, c)
			}
		}
		pending = kept
		lateMu.Unlock()
		for _, c := range due {
			for _, k := range c.keys {
				s.commit(k)
				late.Add(1)
				check(r, k) // at once: before the next rebuild reads it
			}
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Warm-up during the load.
	wg.Go(func() {
		if err := l.Fill(ctx, s.keys(ctx)); err != nil {
			t.Errorf("Fill: %v", err)
		}
	})
	// Rebuilds, back to back once Fill is done, each moving the fake
	// clock a quarter of the settle time; the late commits follow them.
	wg.Go(func() {
		r := rand.New(rand.NewPCG(seed, 100))
		for {
			select {
			case <-stop:
				return
			default:
			}
			if !l.Ready() {
				runtime.Gosched() // Fill runs
				continue
			}
			if err := l.rebuildNow(ctx); err != nil {
				// ErrFull: the guard grew past what the cap it was sized
				// for holds while the replacement was sized. The Loader
				// keeps the guard it has; try again.
				if !errors.Is(err, guard.ErrFull) {
					t.Errorf("rebuild: %v", err)
					return
				}
				runtime.Gosched()
				continue
			}
			// The clock moves with the rebuilds, so that a late commit,
			// two rebuilds after its write, comes within the settle
			// time, as WithUnsettled assumes of the store.
			clock.Add(settle / 4)
			rebuilds.Add(1)
			commitLate(r, false)
		}
	})
	// insertGenerated inserts n rows whose keys the store generates, with
	// one of four outcomes: commit, commit and panic, ErrMaybeWritten with
	// a late commit, ErrMaybeWritten and nothing written.
	insertGenerated := func(wctx context.Context, n, outcome int) {
		var ids []int
		defer func() {
			for _, id := range ids {
				inFlight.end(id)
			}
		}()
		l.InsertGenerated(wctx, func(ctx context.Context, add func(int) error) error {
			ids = make([]int, n)
			for i := range ids {
				ids[i] = int(generated.Add(1) - 1)
				inFlight.begin(ids[i])
				if err := add(ids[i]); err != nil {
					return err
				}
			}
			switch outcome {
			case 0:
				for _, id := range ids {
					s.create(id)
				}
				return nil
			case 1:
				for _, id := range ids {
					s.create(id)
				}
				panic("after the commit")
			case 2:
				for _, id := range ids {
					s.hold(id) // a new id: never taken
				}
				deferCommit(ids...)
			}
			return ErrMaybeWritten
		})
	}
	insert := func(r *rand.Rand, k int) {
		inFlight.begin(k)
		defer inFlight.end(k)
		wctx := ctx
		switch o := r.IntN(9); o {
		case 0, 1: // commit, or a duplicate refused by the server
			l.Insert(wctx, k, func(context.Context) error {
				if !s.create(k) {
					return errDuplicate
				}
				return nil
			})
		case 2: // ErrMaybeWritten, with the row
			l.Insert(wctx, k, func(context.Context) error { s.create(k); return ErrMaybeWritten })
		case 3: // ErrMaybeWritten, without it
			l.Insert(wctx, k, func(context.Context) error { return ErrMaybeWritten })
		case 4: // ErrMaybeWritten, and the commit comes later
			l.Insert(wctx, k, func(context.Context) error {
				if !s.hold(k) {
					return errDuplicate
				}
				deferCommit(k)
				return ErrMaybeWritten
			})
		case 5: // a panic after the commit
			catch(func() {
				l.Insert(wctx, k, func(context.Context) error { s.create(k); panic("after the commit") })
			})
		case 6: // a context cancelled before the write
			c, cancel := context.WithCancel(ctx)
			cancel()
			l.Insert(c, k, func(context.Context) error { s.create(k); return nil })
		case 7: // the caller hangs up after the commit
			c, cancel := context.WithCancel(ctx)
			l.Insert(c, k, func(ctx context.Context) error { s.create(k); cancel(); return ctx.Err() })
		case 8: // rows whose keys the store generates
			n := 1 + r.IntN(3)
			outcome := r.IntN(4)
			catch(func() { insertGenerated(wctx, n, outcome) })
		}
	}
	del := func(r *rand.Rand, k int) {
		inFlight.begin(k)
		defer inFlight.end(k)
		switch r.IntN(3) {
		case 0:
			l.Delete(ctx, k, func(context.Context) (bool, error) { return s.remove(k), nil })
		case 1: // deleted, then the connection broke
			l.Delete(ctx, k, func(context.Context) (bool, error) { return s.remove(k), errors.New("connection reset") })
		case 2: // deleted, and reported nothing deleted
			l.Delete(ctx, k, func(context.Context) (bool, error) { s.remove(k); return false, nil })
		}
	}
	for w := range 3 { // writers
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				ops.Add(1)
				k := anyKey(r)
				switch x := r.IntN(10); {
				case x < 4:
					insert(r, k%keys) // generated keys are InsertGenerated's alone
					check(r, k%keys)  // and read it back, as the client would
				case x < 6:
					del(r, k)
				default:
					check(r, k)
				}
			}
		})
	}
	for rd := range 2 { // readers
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(10+rd)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				ks := make([]int, 1+r.IntN(4))
				for i := range ks {
					ks[i] = anyKey(r)
				}
				check(r, ks...)
			}
		})
	}
	<-time.After(d) // the run's length; no outcome waits on it
	close(stop)
	wg.Wait()
	commitLate(rand.New(rand.NewPCG(seed, 200)), true)
	for l.Stats().Rebuilding {
		runtime.Gosched()
	}
	r := rand.New(rand.NewPCG(seed, 300))
	for k := range int(generated.Load()) {
		check(r, k)
	}
	res.checked, res.wrong, res.late, res.ops = checked.Load(), wrong.Load(), late.Load(), ops.Load()
	res.addFailures = addFailures.Load()
	res.stats = l.Stats()
	return res
}

// TestLoaderStressWriteOutcomes is the stress of issue 44: three writers
// share 2000 keys and the keys of their InsertGenerated rows; their
// inserts commit, hit duplicates, fail with ErrMaybeWritten with the row,
// without it and with a commit that comes two rebuilds later, commit and
// panic, meet a cancelled context before or after the commit; their
// deletes delete, delete and then fail, or delete and say they did not.
// Two readers and the writers look keys up with Get and GetMany while the
// Loader fills, rebuilds back to back, caches negative answers and runs
// into its memory cap. A key whose row was there, the same incarnation,
// before and after a lookup must never read ErrNotFound.
//
// The oracle is checked by two mutations that must make it fail: a
// rollback rule that takes the key back after every failed write
// (WithRollback), and a Loader that forgets a write's unknown outcome at
// once (withoutUnsettled), as it did before issue 44.
func TestLoaderStressWriteOutcomes(t *testing.T) {
	seed := testrand.Seed(t)
	d, m := 20*time.Second, 1500*time.Millisecond
	if testing.Short() {
		d, m = 3*time.Second, time.Second
	}
	res := runStress(t, seed, d)
	st := res.stats
	t.Logf("%d ops, %d lookups of present keys checked, %d wrong 404s; %d late commits; rebuilds %d (errors %d), unsettled %d (overflows %d), pass-through shards %d, store calls %d, avoided %d, negative-cache hits %d, adds refused by the memory cap %d",
		res.ops, res.checked, res.wrong, res.late, st.Rebuilds, st.RebuildErrors, st.Unsettled, st.UnsettledOverflows, st.PassThroughShards, st.StoreCalls, st.Avoided, st.NegativeCacheHits, res.addFailures+int64(st.Guard.AddFailures))
	if res.wrong != 0 {
		t.Errorf("%d wrong 404s in %d lookups of present keys", res.wrong, res.checked)
	}
	// Overflows of WithUnsettled's max depend on how fast the writers
	// ran; TestUnsettledKeysSettle covers them every time.
	if res.checked == 0 || res.late == 0 || st.Rebuilds == 0 || st.Avoided == 0 || st.NegativeCacheHits == 0 || res.addFailures+int64(st.Guard.AddFailures) == 0 {
		t.Errorf("the run did not exercise the Loader: %+v", res)
	}
	for _, mut := range []struct {
		name string
		opt  Option
	}{
		{"rollback after every error", WithRollback(func(error) bool { return true })},
		{"unknown outcomes forgotten", withoutUnsettled()},
	} {
		t.Run("mutation="+mut.name, func(t *testing.T) {
			res := runStress(t, seed, m, mut.opt)
			t.Logf("%d lookups of present keys checked, %d wrong 404s", res.checked, res.wrong)
			if res.wrong == 0 {
				t.Errorf("the oracle did not catch the mutation %q", mut.name)
			}
		})
	}
}
