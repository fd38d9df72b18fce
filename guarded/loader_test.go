package guarded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// memStore is an in-memory store with a counted lookup.
type memStore[K comparable] struct {
	mu    sync.RWMutex
	rows  map[K]string
	calls atomic.Int64
}

func newMemStore[K comparable]() *memStore[K] {
	return &memStore[K]{rows: map[K]string{}}
}

func (s *memStore[K]) lookup(ctx context.Context, k K) (string, error) {
	s.calls.Add(1)
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.rows[k]
	if !ok {
		return "", ErrNotFound
	}
	return v, nil
}

func (s *memStore[K]) put(k K, v string) {
	s.mu.Lock()
	s.rows[k] = v
	s.mu.Unlock()
}

func (s *memStore[K]) del(k K) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.rows[k]
	delete(s.rows, k)
	return ok
}

// keys iterates over a copy of the store's keys.
func (s *memStore[K]) keys(ctx context.Context) iter.Seq2[K, error] {
	s.mu.RLock()
	ks := make([]K, 0, len(s.rows))
	for k := range s.rows {
		ks = append(ks, k)
	}
	s.mu.RUnlock()
	return func(yield func(K, error) bool) {
		for _, k := range ks {
			if !yield(k, nil) {
				return
			}
		}
	}
}

// getter adapts f to a Getter, its types inferred.
// readAll is a stream's read of every key of s, for Feed.Resync.
func (s *memStore[K]) readAll(ctx context.Context, add func(K) error) error {
	for k, err := range s.keys(ctx) {
		if err != nil {
			return err
		}
		if err := add(k); err != nil {
			return err
		}
	}
	return nil
}

func getter[K comparable, V any](f func(context.Context, K) (V, error)) Getter[K, V] {
	return GetterFunc[K, V](f)
}

// withKeys is s as a KeyLister: rebuilds read every key of s.
func (s *memStore[K]) withKeys() Funcs[K, string] {
	return Funcs[K, string]{Lookup: s.lookup, ListKeys: s.keys}
}

// uncapped rebuilds a guard without its memory cap.
func uncapped(old *guard.Guard, n int) (*guard.Guard, error) {
	return old.Fresh(n, guard.WithMaxBytes(0))
}

// Get makes a *memStore a Getter without a key source.
func (s *memStore[K]) Get(ctx context.Context, k K) (string, error) { return s.lookup(ctx, k) }

// newTestLoader returns a Loader over store with a guard made of gopts.
func newTestLoader[K comparable](t *testing.T, store Getter[K, string], gopts []guard.Option, opts ...Option) *Loader[K, string] {
	t.Helper()
	g, err := guard.New(gopts...)
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]Option{WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	l, err := New(g, store, opts...)
	if err != nil {
		g.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestLoaderWarmUpAndShortCircuit(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[string]()
	for i := range 1000 {
		s.put("u"+strconv.Itoa(i), "row"+strconv.Itoa(i))
	}
	var progress atomic.Int64
	l := newTestLoader(t, s, []guard.Option{guard.WithCapacity(1000)}, WithFillProgress(func(n int64) { progress.Store(n) }))

	// Not ready: an absent key reaches the store.
	if _, err := l.Get(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(absent) before fill = %v, want ErrNotFound from the store", err)
	}
	if s.calls.Load() != 1 || l.Ready() || l.Stats().PassedThrough != 1 {
		t.Fatalf("before fill: %d store calls, ready %v, %+v", s.calls.Load(), l.Ready(), l.Stats())
	}
	if err := l.Fill(ctx, s.keys(ctx)); err != nil {
		t.Fatal(err)
	}
	if !l.Ready() || progress.Load() != 1000 {
		t.Fatalf("after fill: ready %v, progress %d", l.Ready(), progress.Load())
	}
	s.calls.Store(0)
	for i := range 1000 {
		v, err := l.Get(ctx, "u"+strconv.Itoa(i))
		if err != nil || v != "row"+strconv.Itoa(i) {
			t.Fatalf("Get(u%d) = %q, %v", i, v, err)
		}
	}
	const absent = 100_000
	for i := range absent {
		if _, err := l.Get(ctx, "x"+strconv.Itoa(i)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get(absent) = %v", err)
		}
	}
	st := l.Stats()
	t.Logf("%+v", st)
	if calls := s.calls.Load(); calls != int64(1000+st.FalsePositives) || st.Avoided+st.FalsePositives != absent {
		t.Fatalf("%d store calls for 1000 present and %d absent keys; stats %+v", calls, absent, st)
	}
	if st.ObservedFPR > 0.01 {
		t.Fatalf("observed FPR %v", st.ObservedFPR)
	}
	if st.LetThrough != 1000+st.FalsePositives || st.PassedThrough != 1 || st.NegativeCacheHits != 0 { // one Get before Fill
		t.Fatalf("lookups let through %d, passed through %d, negative cache %d; want %d, 1, 0",
			st.LetThrough, st.PassedThrough, st.NegativeCacheHits, 1000+st.FalsePositives)
	}
}

// TestLoaderCoalescesAndHonoursContext checks that concurrent Gets of one
// key share one store call, that a waiter whose ctx ends leaves at once
// while the call goes on for the others, and that when the Get running the
// call leaves, its call is cancelled and the waiters start a new one
// rather than fail.
func TestLoaderCoalescesAndHonoursContext(t *testing.T) {
	for _, leaderLeaves := range []bool{false, true} {
		t.Run(fmt.Sprintf("leader-leaves=%v", leaderLeaves), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testCoalesce(t, leaderLeaves) })
		})
	}
}

func testCoalesce(t *testing.T, leaderLeaves bool) {
	release := make(chan struct{})
	var calls, cancelled atomic.Int64
	lookup := func(ctx context.Context, k string) (string, error) {
		calls.Add(1)
		select {
		case <-release:
			return "v", nil
		case <-ctx.Done(): // a store that honours ctx, as database/sql does
			cancelled.Add(1)
			return "", ctx.Err()
		}
	}
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(g, getter(lookup))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.MarkReady()
	if err := l.Insert(context.Background(), "k", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// The first Get runs the store call; eight more wait on it; one of
	// the nine gives up.
	get := func(ctx context.Context, res chan<- error) {
		v, err := l.Get(ctx, "k")
		if err == nil && v != "v" {
			err = fmt.Errorf("Get = %q, want v", v)
		}
		res <- err
	}
	cctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	results := make(chan error, 8)
	if leaderLeaves {
		go get(cctx, gaveUp)
	} else {
		go get(context.Background(), results)
	}
	synctest.Wait() // the store call is running
	for i := range 8 {
		if !leaderLeaves && i == 0 {
			go get(cctx, gaveUp)
		} else {
			go get(context.Background(), results)
		}
	}
	synctest.Wait() // every Get is waiting
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d store calls for 9 concurrent Gets of one key, want 1", n)
	}
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Get = %v, want context.Canceled", err)
	}
	synctest.Wait()
	wantCalls, wantCancelled := int64(1), int64(0)
	if leaderLeaves {
		// The leader's call was cancelled with it; the waiters started
		// one new call between them.
		wantCalls, wantCancelled = 2, 1
	}
	if calls.Load() != wantCalls || cancelled.Load() != wantCancelled {
		t.Fatalf("after the cancel: %d store calls, %d cancelled; want %d, %d", calls.Load(), cancelled.Load(), wantCalls, wantCancelled)
	}
	close(release) // the running call completes for everyone still waiting
	for range 8 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != wantCalls {
		t.Fatalf("%d store calls, want %d", calls.Load(), wantCalls)
	}
	if _, err := l.Get(cctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a done ctx = %v", err)
	}
}

func TestLoaderInsertDeleteOrdering(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int64]()
	l := newTestLoader(t, s, nil)
	l.MarkReady()

	// The guard has the key before the row is visible.
	err := l.Insert(ctx, 7, func(context.Context) error {
		if !l.MayContain(7) {
			t.Errorf("key not in the guard while its write runs")
		}
		s.put(7, "seven")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A write that certainly failed is rolled back; an uncertain one is kept.
	boom := errors.New("boom")
	n := l.Guard().Len()
	refused := fmt.Errorf("%w: %w", boom, ErrNotWritten)
	if err := l.Insert(ctx, 8, func(context.Context) error { return refused }); !errors.Is(err, boom) {
		t.Fatalf("Insert = %v, want boom", err)
	}
	if l.Guard().Len() != n {
		t.Fatalf("failed insert left the key in the guard")
	}
	maybe := fmt.Errorf("commit ack lost: %w", ErrMaybeWritten)
	if err := l.Insert(ctx, 9, func(context.Context) error { s.put(9, "nine"); return maybe }); !errors.Is(err, ErrMaybeWritten) {
		t.Fatalf("Insert = %v", err)
	}
	if v, err := l.Get(ctx, 9); err != nil || v != "nine" {
		t.Fatalf("Get(9) after an uncertain write = %q, %v", v, err)
	}
	// Delete of a missing row, a failed delete, and a real one.
	n = l.Guard().Len()
	if err := l.Delete(ctx, 100, func(context.Context) (bool, error) { return false, nil }); err != nil || l.Guard().Len() != n {
		t.Fatalf("Delete of a missing row changed the guard: %v", err)
	}
	if err := l.Delete(ctx, 7, func(context.Context) (bool, error) { return false, boom }); !errors.Is(err, boom) || !l.MayContain(7) {
		t.Fatalf("failed Delete removed the key: %v", err)
	}
	if err := l.Delete(ctx, 7, func(context.Context) (bool, error) { return s.del(7), nil }); err != nil {
		t.Fatal(err)
	}
	if l.Guard().Len() != n-1 {
		t.Fatalf("Delete did not remove the key from the guard")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	called := false
	if err := l.Insert(cctx, 1, func(context.Context) error { called = true; return nil }); !errors.Is(err, context.Canceled) || called {
		t.Fatalf("Insert with a done ctx = %v (write called: %v)", err, called)
	}
}

func TestLoaderNegativeCache(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[string]()
	now := time.Unix(0, 0)
	var nowMu sync.Mutex
	clock := func() time.Time { nowMu.Lock(); defer nowMu.Unlock(); return now }
	l := newTestLoader(t, s, nil, WithNegativeCache(100, time.Second), withClock(clock))
	l.MarkReady()
	// Find a false positive: an absent key the guard lets through. Add
	// keys to the guard only (as if their rows were elsewhere).
	var fp string
	for i := 0; fp == ""; i++ {
		if err := l.Guard().AddString("g" + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			for j := range 100_000 {
				if k := "probe" + strconv.Itoa(j); l.MayContain(k) {
					fp = k
					break
				}
			}
		}
	}
	for range 3 {
		if _, err := l.Get(ctx, fp); !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
	}
	st := l.Stats()
	if s.calls.Load() != 1 || st.NegativeCacheHits != 2 || st.FalsePositives != 1 {
		t.Fatalf("3 Gets of a false positive: %d store calls, %+v", s.calls.Load(), st)
	}
	// Expiry.
	nowMu.Lock()
	now = now.Add(2 * time.Second)
	nowMu.Unlock()
	l.Get(ctx, fp)
	if s.calls.Load() != 2 {
		t.Fatalf("expired entry still served")
	}
	// An insert voids the entry at once.
	if err := l.Insert(ctx, fp, func(context.Context) error { s.put(fp, "row"); return nil }); err != nil {
		t.Fatal(err)
	}
	if v, err := l.Get(ctx, fp); err != nil || v != "row" {
		t.Fatalf("Get after Insert = %q, %v; the negative cache hid a committed row", v, err)
	}
}

type userID string

type compound struct {
	a int
	b string
}

// encoded is a compound key that implements Key.
type encoded compound

func (e encoded) AppendKey(b []byte) []byte {
	return append(strconv.AppendInt(b, int64(e.a), 10), append([]byte{'/'}, e.b...)...)
}

// caseless is a string key that ignores case.
type caseless string

func (c caseless) AppendKey(b []byte) []byte {
	return append(b, strings.ToLower(string(c))...)
}

func TestLoaderKeyTypes(t *testing.T) {
	ctx := context.Background()
	g := func() *guard.Guard { return mustNew(t, guard.WithSeed(7)) } // each Loader owns its guard
	check := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Run("named string", func(t *testing.T) {
		l, err := New(g(), getter(func(context.Context, userID) (int, error) { return 1, nil }))
		check(t, err)
		if l.Hash("a") != l.Guard().HashString("a") {
			t.Fatalf("a userID key does not hash as its string")
		}
		l.MarkReady()
		if n := testing.AllocsPerRun(100, func() { l.MayContain("abc") }); n != 0 {
			t.Fatalf("MayContain allocates %v times", n)
		}
	})
	t.Run("int32", func(t *testing.T) {
		l, err := New(g(), getter(func(context.Context, int32) (int, error) { return 1, nil }))
		check(t, err)
		l64, err := New(g(), getter(func(context.Context, int64) (int, error) { return 1, nil }))
		check(t, err)
		if l.Hash(-5) != l64.Hash(-5) || l.Hash(5) == l.Hash(6) {
			t.Fatalf("integer keys do not hash by value")
		}
		if n := testing.AllocsPerRun(100, func() { l.MayContain(42) }); n != 0 {
			t.Fatalf("MayContain allocates %v times", n)
		}
	})
	t.Run("uint16 and byte array", func(t *testing.T) {
		lu, err := New(g(), getter(func(context.Context, uint16) (int, error) { return 1, nil }))
		check(t, err)
		if lu.Hash(65535) != hashUint64(lu.Guard(), 65535) {
			t.Fatalf("uint16 key hashes wrongly")
		}
		la, err := New(g(), getter(func(context.Context, [4]byte) (int, error) { return 1, nil }))
		check(t, err)
		if la.Hash([4]byte{1, 2, 3, 4}) != la.Guard().Hash([]byte{1, 2, 3, 4}) {
			t.Fatalf("a byte-array key does not hash as its bytes")
		}
	})
	t.Run("struct needs Key", func(t *testing.T) {
		lookup := func(context.Context, compound) (int, error) { return 1, nil }
		if _, err := New(g(), getter(lookup)); err == nil {
			t.Fatalf("New accepted a struct key that does not implement Key")
		} else {
			t.Log(err)
		}
		l, err := New(g(), getter(func(context.Context, encoded) (int, error) { return 1, nil }))
		check(t, err)
		l.MarkReady()
		if err := l.Insert(ctx, encoded{1, "x"}, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if !l.MayContain(encoded{1, "x"}) {
			t.Fatalf("false negative with a custom encoder")
		}
		if l.Hash(encoded{1, "x"}) != l.Guard().Hash([]byte("1/x")) {
			t.Fatalf("a Key hashes as something else than its AppendKey bytes")
		}
		// A Key wins over the underlying type's own encoding.
		lc, err := New(g(), getter(func(context.Context, caseless) (int, error) { return 1, nil }))
		check(t, err)
		if lc.Hash("ABC") != lc.Hash("abc") || lc.Hash("abc") == lc.Guard().HashString("ABC") {
			t.Fatalf("a string type that implements Key is not hashed by it")
		}
	})
	t.Run("bad options", func(t *testing.T) {
		lookup := func(context.Context, string) (int, error) { return 1, nil }
		for _, o := range []Option{WithMaxFPR(0), WithLoadTimeout(-time.Second), WithNegativeCache(10, 0), WithFillWorkers(0)} {
			if _, err := New(g(), getter(lookup), o); err == nil {
				t.Errorf("New accepted an invalid option")
			}
		}
		if _, err := New[string, int](nil, getter(lookup)); err == nil {
			t.Errorf("New accepted a nil guard")
		}
		for _, o := range []Option{WithRollback(nil), WithNotFound(nil), WithLogger(nil)} {
			if _, err := New(g(), getter(lookup), o); err == nil {
				t.Errorf("New accepted a nil function or logger")
			}
		}
	})
	t.Run("one Loader per guard", func(t *testing.T) {
		lookup := func(context.Context, string) (int, error) { return 1, nil }
		shared := g()
		if _, err := New(shared, getter(lookup), WithMaxFPR(0)); err == nil {
			t.Fatal("New accepted an invalid option")
		}
		// The failed New did not claim the guard; this one does.
		if _, err := New(shared, getter(lookup)); err != nil {
			t.Fatal(err)
		}
		if _, err := New(shared, getter(lookup)); err == nil {
			t.Fatal("a second Loader took a guard that the first one closes")
		}
	})
}

// TestLoaderConcurrentModel runs inserts, deletes and gets from many
// goroutines against an in-memory store, with a guard that starts small
// under a tight memory cap, so that shards saturate, pass through and get
// rebuilt (without the cap: WithRebuildGuard lifts it). A row whose
// Insert returned must never read ErrNotFound until its Delete begins.
func TestLoaderConcurrentModel(t *testing.T) {
	seed := testrand.Seed(t)
	ctx := context.Background()
	s := newMemStore[string]()
	l := newTestLoader(t, s.withKeys(), []guard.Option{guard.WithCapacity(1000), guard.WithShards(2), guard.WithMaxBytes(8 << 10), guard.WithSeed(seed)},
		WithNegativeCache(1000, time.Minute), WithRebuildGuard(uncapped))
	if err := l.Fill(ctx, s.keys(ctx)); err != nil {
		t.Fatal(err)
	}
	// The workers share a fixed number of operations, so that the guard
	// saturates and is rebuilt at every GOMAXPROCS, -short included.
	procs := max(runtime.GOMAXPROCS(0), 2)
	total := 40_000
	if testing.Short() {
		total = 12_000
	}
	ops := total / procs
	errc := make(chan error, procs)
	var wg sync.WaitGroup
	for w := range procs {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			var mine []string // committed rows of this worker
			for i := range ops {
				switch x := r.IntN(10); {
				case x < 4:
					k := fmt.Sprintf("w%d/%d", w, i)
					if err := l.Insert(ctx, k, func(context.Context) error { s.put(k, k); return nil }); err != nil {
						errc <- err
						return
					}
					mine = append(mine, k)
				case x < 5 && len(mine) > 0:
					j := r.IntN(len(mine))
					k := mine[j]
					mine[j] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					if err := l.Delete(ctx, k, func(context.Context) (bool, error) { return s.del(k), nil }); err != nil {
						errc <- err
						return
					}
				case len(mine) > 0:
					k := mine[r.IntN(len(mine))]
					if v, err := l.Get(ctx, k); err != nil || v != k {
						errc <- fmt.Errorf("Get(%q) of a committed row = %q, %v (%+v)", k, v, err, l.Stats())
						return
					}
					l.Get(ctx, "absent"+strconv.Itoa(r.IntN(1000)))
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	// Let a running rebuild finish, then check every row once more.
	for l.Stats().Rebuilding {
		runtime.Gosched()
	}
	for k := range s.keys(ctx) {
		if _, err := l.Get(ctx, k); err != nil {
			t.Fatalf("Get(%q) = %v after the run", k, err)
		}
	}
	st := l.Stats()
	t.Logf("rebuilds %d (errors %d), pass-through shards %d, store calls %d, avoided %d, FP %d, neg hits %d, guard %d items %d doublings",
		st.Rebuilds, st.RebuildErrors, st.PassThroughShards, st.StoreCalls, st.Avoided, st.FalsePositives, st.NegativeCacheHits, st.Guard.Items, st.Guard.Doublings)
	if st.Rebuilds == 0 {
		t.Errorf("no rebuild happened; the test should saturate the guard")
	}
}

// TestLoaderRebuildDuringFill saturates the guard during its warm-up: the
// rebuild it triggers may replace the guard that Fill is adding to, and
// Fill must still succeed with every row findable.
func TestLoaderRebuildDuringFill(t *testing.T) {
	ctx := context.Background()
	for round := range 20 {
		s := newMemStore[int]()
		for i := range 5000 {
			s.put(i, "r")
		}
		l := newTestLoader(t, s.withKeys(), []guard.Option{guard.WithCapacity(500), guard.WithShards(2), guard.WithMaxBytes(4500)}, WithFillWorkers(2),
			WithRebuildGuard(uncapped))
		if err := l.Fill(ctx, s.keys(ctx)); err != nil {
			t.Fatalf("round %d: Fill: %v", round, err)
		}
		for l.Stats().Rebuilding {
			runtime.Gosched()
		}
		for i := range 5000 {
			if _, err := l.Get(ctx, i); err != nil {
				t.Fatalf("round %d: Get(%d) = %v (%+v)", round, i, err, l.Stats())
			}
		}
		if st := l.Stats(); st.Rebuilds == 0 {
			t.Fatalf("round %d: no rebuild", round)
		}
		l.Close()
	}
}

// TestLoaderCatchUpAfterRestore restores a guard from a snapshot, checks
// that the Loader passes everything through until CatchUp, and that after
// applying the changes made since the snapshot it answers correctly.
func TestLoaderCatchUpAfterRestore(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	g := mustNew(t, guard.WithSeed(5))
	for i := range 1000 {
		s.put(i, "r")
		if err := g.AddHash(hashUint64(g, uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	var snap bytes.Buffer
	if _, err := g.WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	// Changes after the snapshot: rows 1000..1099 created, 0..49 deleted.
	var changes []Change[int]
	for i := 1000; i < 1100; i++ {
		s.put(i, "r")
		changes = append(changes, Change[int]{Key: i})
	}
	for i := range 50 {
		s.del(i)
		changes = append(changes, Change[int]{Key: i, Deleted: true})
	}
	r, err := guard.Restore(&snap)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(r, getter(s.lookup), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Not caught up: a row created after the snapshot is still found.
	if _, err := l.Get(ctx, 1050); err != nil {
		t.Fatalf("Get(1050) before CatchUp = %v", err)
	}
	if l.Ready() {
		t.Fatal("a Loader over a restored guard is ready before CatchUp")
	}
	if err := l.CatchUp(ctx, seqOf(changes)); err != nil {
		t.Fatal(err)
	}
	for i := 50; i < 1100; i++ {
		if _, err := l.Get(ctx, i); err != nil {
			t.Fatalf("Get(%d) after CatchUp = %v", i, err)
		}
	}
	if n := l.Guard().Len(); n != 1050 {
		t.Fatalf("guard holds %d keys after CatchUp, want 1050", n)
	}
	s.calls.Store(0)
	for i := 2000; i < 3000; i++ {
		l.Get(ctx, i)
	}
	if st := l.Stats(); s.calls.Load() != int64(st.FalsePositives) {
		t.Fatalf("%d store calls for absent keys, %d false positives", s.calls.Load(), st.FalsePositives)
	}
}

// seqOf yields the elements of xs with no error.
func seqOf[T any](xs []T) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for _, x := range xs {
			if !yield(x, nil) {
				return
			}
		}
	}
}

// TestFeedInMemory drives a Loader from a change stream that is not
// PostgreSQL, as a CDC pipeline or a message queue could: a Feed's Apply of
// others' writes, Invalidate on a lost stream, Resync with an insert
// through the Loader racing the fill, the Loader's requests for a resync
// on Requests, Replace with a guard saved earlier (of another seed), and
// Detach.
func TestFeedInMemory(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	l := newTestLoader(t, s, []guard.Option{guard.WithCapacity(1000)})
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AttachFeed(); err == nil {
		t.Fatal("a second feed was attached")
	}
	if l.Ready() {
		t.Fatal("ready after AttachFeed, before the feed resynced")
	}
	feed.MarkReady()
	s.put(1, "r")
	if err := feed.Apply(Change[int]{Key: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Get(ctx, 1); err != nil {
		t.Fatalf("Get after Apply = %v", err)
	}
	s.del(1)
	if err := feed.Apply(Change[int]{Key: 1, Deleted: true}); err != nil || l.Guard().Len() != 0 {
		t.Fatalf("Apply(delete): %v, %d keys", err, l.Guard().Len())
	}
	feed.Invalidate()
	if l.Ready() || !l.MayContain(12345) {
		t.Fatal("an invalidated Loader does not pass lookups through")
	}
	for i := range 100 {
		s.put(i, "r")
	}
	err = feed.Resync(ctx, func(ctx context.Context, add func(int) error) error {
		if l.Ready() {
			t.Error("Loader ready during Resync")
		}
		// A write through this Loader while the fresh guard fills.
		if err := l.Insert(ctx, 500, func(context.Context) error { s.put(500, "r"); return nil }); err != nil {
			return err
		}
		for i := range 100 {
			if err := add(i); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if l.Ready() {
		t.Fatal("ready after Resync, before the caller caught up")
	}
	feed.MarkReady()
	for _, k := range []int{0, 99, 500} {
		if _, err := l.Get(ctx, k); err != nil {
			t.Fatalf("Get(%d) after Resync = %v", k, err)
		}
	}
	if n := l.Guard().Len(); n != 101 {
		t.Fatalf("%d keys after Resync, want 101", n)
	}
	// A rebuild the Loader needs is asked on Requests, at most once per
	// interval, without waiting for the stream to read it.
	l.rebuild()
	l.rebuild()
	select {
	case <-feed.Requests():
	default:
		t.Fatal("the Loader asked for no resync")
	}
	select {
	case <-feed.Requests():
		t.Fatal("the Loader asked for two resyncs within the interval")
	default:
	}
	// Replace: a guard saved with the stream's position, restored; its
	// seed is not the current guard's. Keys added to it before are found,
	// and Inserts and Applies after it hash with its seed.
	var saved bytes.Buffer
	old, err := guard.New(guard.WithCapacity(1000), guard.WithSeed(l.Guard().Seed()+1))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		old.AddHash(l.codec.hash(old, i))
	}
	if _, err := old.WriteTo(&saved); err != nil {
		t.Fatal(err)
	}
	old.Close()
	restored, err := guard.Restore(&saved)
	if err != nil {
		t.Fatal(err)
	}
	if err := feed.Replace(restored); err != nil {
		t.Fatal(err)
	}
	if l.Ready() || l.Guard() != restored {
		t.Fatal("Replace left the Loader ready, or did not install the guard")
	}
	s.put(600, "r")
	if err := feed.Apply(Change[int]{Key: 600}); err != nil { // a change after the saved position
		t.Fatal(err)
	}
	if err := l.Insert(ctx, 700, func(context.Context) error { s.put(700, "r"); return nil }); err != nil {
		t.Fatal(err)
	}
	feed.MarkReady()
	for _, k := range []int{0, 99, 600, 700} {
		if _, err := l.Get(ctx, k); err != nil {
			t.Fatalf("Get(%d) after Replace = %v", k, err)
		}
	}
	// Detached, the Loader cannot know what it lacks, and the feed refuses.
	feed.Detach()
	feed.Detach()
	if l.Ready() {
		t.Fatal("ready after the feed detached")
	}
	if err := feed.Apply(Change[int]{Key: 1}); !errors.Is(err, errDetached) {
		t.Fatalf("Apply after Detach = %v", err)
	}
	if _, err := l.AttachFeed(); err != nil {
		t.Fatalf("AttachFeed after Detach: %v", err)
	}
}

// TestMayContainCountsNothing checks that asking (MayContain) leaves the
// lookup counters alone, so that middleware plus Get counts a request
// once.
func TestMayContainCountsNothing(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	s.put(1, "one")
	l := newTestLoader(t, s, nil)
	l.MayContain(1) // not ready: would have counted as passed through
	if err := l.Fill(ctx, s.keys(ctx)); err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		l.MayContain(i)
	}
	st := l.Stats()
	if st.Avoided+st.LetThrough+st.PassedThrough+st.NegativeCacheHits != 0 {
		t.Fatalf("MayContain changed the lookup counters: %+v", st)
	}
	l.Get(ctx, 1)
	if st := l.Stats(); st.LetThrough != 1 {
		t.Fatalf("Get of a present key: let through %d, want 1", st.LetThrough)
	}
}

// TestOneLoaderPerGuard: a guard that a Loader owns is refused by a second
// Loader and by the first one's Feed.Replace, and the mark that says so is
// the guard's own: a Loader dropped without Close leaves nothing behind
// that keeps its guard reachable (a process-wide registry did).
func TestOneLoaderPerGuard(t *testing.T) {
	s := newMemStore[int]()
	l := newTestLoader(t, s, nil)
	if l2, err := New(l.Guard(), Getter[int, string](s)); !errors.Is(err, errOwned) || l2 != nil {
		t.Fatalf("New with an owned guard = %v, %v; want nil, errOwned", l2, err)
	}
	f, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Replace(l.Guard()); !errors.Is(err, errOwned) {
		t.Fatalf("Feed.Replace with the Loader's own guard = %v, want errOwned", err)
	}

	collected := make(chan struct{})
	func() {
		g, err := guard.New()
		if err != nil {
			t.Fatal(err)
		}
		runtime.AddCleanup(g, func(struct{}) { close(collected) }, struct{}{})
		if _, err := New(g, Getter[int, string](s)); err != nil {
			t.Fatal(err)
		}
	}()
	for range 20 {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal("the guard of a dropped Loader was not collected")
}
