package guarded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// The tests in this file check the copy-count rule of the Loader: a guard
// removes only copies it holds. Each removal of a key the guard does not
// hold can take the copy of a colliding key (same shard, same 16-bit slot
// value in a shared bucket), which then reads absent.

// collisionOpts makes small guards in which colliding keys are quick to
// find; every guard made with them hashes alike.
var collisionOpts = []guard.Option{guard.WithSeed(12345), guard.WithShards(1), guard.WithCapacity(10)}

// collidingKey returns an integer key other than y that a guard holding
// only y reports present: its slot value equals y's in one of their
// buckets, so removing it from a guard that lacks it removes y.
func collidingKey(t *testing.T, y int) int {
	t.Helper()
	return keyMatching(t, y, func(int) bool { return true })
}

// keyMatching returns the first key after y that a guard made with
// collisionOpts holding y answers present for, and that also passes ok.
func keyMatching(t *testing.T, y int, ok func(k int) bool) int {
	t.Helper()
	g := mustNew(t, collisionOpts...)
	if err := g.AddHash(hashUint64(g, uint64(y))); err != nil {
		t.Fatal(err)
	}
	for k := y + 1; k < y+50_000_000; k++ {
		if g.ContainsHash(hashUint64(g, uint64(k))) && ok(k) {
			return k
		}
	}
	t.Fatalf("no key collides with %d", y)
	return 0
}

// TestLoaderDeleteDuringWarmUp is the first sequence of the issue: a
// Delete of a row that existed before the Loader, while Fill has not read
// it, must not remove the colliding copy of a key inserted meanwhile.
func TestLoaderDeleteDuringWarmUp(t *testing.T) {
	ctx := context.Background()
	const y = 1
	k := collidingKey(t, y)
	s := newMemStore[int]()
	s.put(k, "k") // existed before the Loader
	l := newTestLoader(t, s, collisionOpts)

	// 1. Insert(y) adds y; its write is in flight.
	inWrite, commit := make(chan struct{}), make(chan struct{})
	inserted := make(chan error, 1)
	go func() {
		inserted <- l.Insert(ctx, y, func(context.Context) error {
			close(inWrite)
			<-commit
			s.put(y, "y")
			return nil
		})
	}()
	<-inWrite
	// 2. Delete(k): the store confirms; the guard never had k.
	if err := l.Delete(ctx, k, func(context.Context) (bool, error) { return s.del(k), nil }); err != nil {
		t.Fatal(err)
	}
	// 3. Fill's read sees neither row.
	read := s.keys(ctx)
	// 4. y commits and Insert returns; Fill marks the Loader ready.
	close(commit)
	if err := <-inserted; err != nil {
		t.Fatal(err)
	}
	if err := l.Fill(ctx, read); err != nil {
		t.Fatal(err)
	}
	// 5. y must be found.
	if v, err := l.Get(ctx, y); err != nil || v != "y" {
		t.Fatalf("Get(%d) = %q, %v after a Delete of colliding key %d during warm-up; want the row", y, v, err, k)
	}
	if _, err := l.Get(ctx, k); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(%d) of the deleted row = %v", k, err)
	}
}

// TestLoaderFeedDeleteBeforeCreation is the second sequence: process B
// creates k, and this process deletes k before its feed has applied k's
// creation. The delete must not remove the colliding copy of x, which this
// process inserted; the feed applies both changes in commit order.
func TestLoaderFeedDeleteBeforeCreation(t *testing.T) {
	ctx := context.Background()
	const x = 1
	k := collidingKey(t, x)
	s := newMemStore[int]()
	l := newTestLoader(t, s, collisionOpts)
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	feed.MarkReady() // the feed resynced an empty table
	if err := l.Insert(ctx, x, func(context.Context) error { s.put(x, "x"); return nil }); err != nil {
		t.Fatal(err)
	}
	s.put(k, "k") // B commits k; its notification is on its way
	if err := l.Delete(ctx, k, func(context.Context) (bool, error) { return s.del(k), nil }); err != nil {
		t.Fatal(err)
	}
	if v, err := l.Get(ctx, x); err != nil || v != "x" {
		t.Fatalf("Get(%d) = %q, %v after deleting colliding key %d created elsewhere; want the row", x, v, err, k)
	}
	// The feed delivers B's creation and this process's delete, in order.
	for _, c := range []Change[int]{{Key: k}, {Key: k, Deleted: true}} {
		if err := feed.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := l.Get(ctx, x); err != nil || v != "x" {
		t.Fatalf("Get(%d) = %q, %v after the feed caught up; want the row", x, v, err)
	}
	if n := l.Guard().Len(); n != 1 {
		t.Fatalf("guard holds %d copies, want 1 (x)", n)
	}
}

// TestLoaderCatchUpReplaysOwnDelete is the third sequence: CatchUp replays
// the store's changes since the snapshot, including a delete this process
// made through the Loader while catching up. The key must be removed once.
func TestLoaderCatchUpReplaysOwnDelete(t *testing.T) {
	ctx := context.Background()
	const x = 1
	k := collidingKey(t, x)
	s := newMemStore[int]()
	g := mustNew(t, collisionOpts...)
	for _, key := range []int{x, k} {
		s.put(key, "r")
		if err := g.AddHash(hashUint64(g, uint64(key))); err != nil {
			t.Fatal(err)
		}
	}
	var snap bytes.Buffer
	if _, err := g.WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	rg, err := guard.Restore(&snap)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(rg, getter(s.lookup))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Delete(ctx, k, func(context.Context) (bool, error) { return s.del(k), nil }); err != nil {
		t.Fatal(err)
	}
	if err := l.CatchUp(ctx, seqOf([]Change[int]{{Key: k, Deleted: true}})); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Get(ctx, x); err != nil {
		t.Fatalf("Get(%d) = %v after CatchUp replayed the delete of colliding key %d", x, err, k)
	}
	if n := l.Guard().Len(); n != 1 {
		t.Fatalf("guard holds %d copies after CatchUp, want 1", n)
	}
	if err := l.CatchUp(ctx, seqOf([]Change[int]{{Key: x, Deleted: true}})); err == nil {
		t.Fatal("CatchUp on a ready Loader replayed changes its Deletes had applied")
	}
}

// sqlStateErr is a server's error with a SQLSTATE, like *pgconn.PgError.
type sqlStateErr string

func (e sqlStateErr) Error() string    { return "ERROR: server says no (SQLSTATE " + string(e) + ")" }
func (e sqlStateErr) SQLState() string { return string(e) }

// retryErr says it is safe to retry, as pgconn's connLockError does for a
// connection that broke while reading the COMMIT reply.
type retryErr struct{ err error }

func (e retryErr) Error() string     { return "conn closed: " + e.err.Error() }
func (e retryErr) Unwrap() error     { return e.err }
func (e retryErr) SafeToRetry() bool { return true }

// TestNotWritten is the first defect of the client-found issue: only
// proof that the store did not commit rolls a key back.
func TestNotWritten(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		// Proof: the server answered the statement or the commit.
		{"unique violation", fmt.Errorf("insert: %w", sqlStateErr("23505")), true},
		{"serialization failure", sqlStateErr("40001"), true},
		{"deadlock", sqlStateErr("40P01"), true},
		{"raised by a trigger", sqlStateErr("P0001"), true},
		{"idle in transaction timeout", sqlStateErr("25P03"), true},
		{"ErrNotWritten", fmt.Errorf("user exists: %w", ErrNotWritten), true},
		// No proof: the commit may have happened.
		{"nil", nil, false},
		{"plain error", errors.New("unique violation"), false},
		{"safe to retry", retryErr{io.ErrUnexpectedEOF}, false},
		{"ErrMaybeWritten", fmt.Errorf("ack lost: %w", ErrMaybeWritten), false},
		{"ErrMaybeWritten over a SQLSTATE", fmt.Errorf("%w: %w", ErrMaybeWritten, sqlStateErr("23505")), false},
		{"ErrMaybeWritten over ErrNotWritten", fmt.Errorf("%w: %w", ErrMaybeWritten, ErrNotWritten), false},
		{"deadline", fmt.Errorf("insert: %w", context.DeadlineExceeded), false},
		{"canceled", context.Canceled, false},
		{"canceled with a SQLSTATE", fmt.Errorf("%w: %w", context.Canceled, sqlStateErr("57014")), false},
		{"net error", &net.OpError{Op: "read", Err: syscall.ECONNRESET}, false},
		{"reset", fmt.Errorf("x: %w", syscall.ECONNRESET), false},
		{"unexpected EOF", fmt.Errorf("read reply: %w", io.ErrUnexpectedEOF), false},
		{"admin shutdown", sqlStateErr("57P01"), false},
		{"crash shutdown", sqlStateErr("57P02"), false},
		{"query canceled", sqlStateErr("57014"), false},
		{"connection failure", sqlStateErr("08006"), false},
		{"I/O error", sqlStateErr("58030"), false},
		{"internal error", sqlStateErr("XX000"), false},
		{"foreign data wrapper", sqlStateErr("HV000"), false},
		{"statement completion unknown", sqlStateErr("40003"), false},
		{"warning", sqlStateErr("01000"), false},
		{"malformed SQLSTATE", sqlStateErr("235"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NotWritten(tt.err); got != tt.want {
				t.Errorf("NotWritten(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// TestLoaderInsertAmbiguousWrite is the first defect of the Loader issue:
// a write whose client gave up (a deadline) after the store committed it
// must not leave the key out of the guard. A write that certainly failed
// is rolled back; WithRollback changes the classification.
func TestLoaderInsertAmbiguousWrite(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	l := newTestLoader(t, s, nil)
	l.MarkReady()
	err := l.Insert(ctx, 1, func(ctx context.Context) error {
		// The deadline is the write's own: one on Insert's ctx could
		// pass before Insert begins, on a loaded machine, and Insert
		// would then rightly write nothing.
		ctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		defer cancel()
		s.put(1, "committed") // the commit reaches the store ...
		<-ctx.Done()          // ... and the acknowledgement does not reach us
		return fmt.Errorf("insert: %w", ctx.Err())
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Insert = %v, want the deadline", err)
	}
	if v, err := l.Get(ctx, 1); err != nil || v != "committed" {
		t.Fatalf("Get(1) = %q, %v after a write that timed out but committed", v, err)
	}
	if err := l.Insert(ctx, 2, func(context.Context) error { return sqlStateErr("23505") }); err == nil {
		t.Fatal("Insert lost its write's error")
	}
	if n := l.Guard().Len(); n != 1 {
		t.Fatalf("guard holds %d keys; the certainly failed insert was not rolled back", n)
	}
	// An error that proves nothing keeps the key, "safe to retry" included.
	if err := l.Insert(ctx, 4, func(context.Context) error { s.put(4, "four"); return retryErr{io.ErrUnexpectedEOF} }); err == nil {
		t.Fatal("Insert lost its write's error")
	}
	if v, err := l.Get(ctx, 4); err != nil || v != "four" {
		t.Fatalf("Get(4) = %q, %v after a write whose COMMIT reply was lost", v, err)
	}

	// A classification that trusts nothing keeps every key.
	l2 := newTestLoader(t, s, nil, WithRollback(func(error) bool { return false }))
	l2.MarkReady()
	l2.Insert(ctx, 3, func(context.Context) error { return sqlStateErr("23505") })
	if n := l2.Guard().Len(); n != 1 {
		t.Fatalf("guard holds %d keys with WithRollback(never), want 1", n)
	}
}

// TestLoaderConcurrentInsertsOfOneKey is the second defect: sixteen
// concurrent Inserts of one key with a slow write must not add sixteen
// copies (which doubled a shard eight times): they run one at a time.
func TestLoaderConcurrentInsertsOfOneKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := newMemStore[int]()
		g, err := guard.New(guard.WithCapacity(100_000))
		if err != nil {
			t.Fatal(err)
		}
		l, err := New(g, getter(s.lookup))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		l.MarkReady()
		var writing, created atomic.Int64
		maxCopies := 0
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				err := l.Insert(ctx, 42, func(context.Context) error {
					if n := writing.Add(1); n != 1 {
						t.Errorf("%d writes of one key at once", n)
					}
					defer writing.Add(-1)
					mu.Lock()
					maxCopies = max(maxCopies, l.Guard().Len())
					mu.Unlock()
					time.Sleep(100 * time.Millisecond) // a slow write (fake time)
					if created.Add(1) > 1 {
						return sqlStateErr("23505") // the server refused it: nothing written
					}
					s.put(42, "v")
					return nil
				})
				if err != nil && err != sqlStateErr("23505") {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		st := l.Stats().Guard
		if maxCopies > 2 || st.Items != 1 || st.Doublings != 0 {
			t.Fatalf("16 inserts of one key: at most %d copies at once, %d at the end, %d doublings; want ≤ 2, 1, 0", maxCopies, st.Items, st.Doublings)
		}
		// A waiting Insert leaves when its ctx ends, without touching the guard.
		hold := make(chan struct{})
		go l.Insert(ctx, 7, func(context.Context) error { <-hold; return nil })
		synctest.Wait()
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- l.Insert(cctx, 7, func(context.Context) error { return nil }) }()
		synctest.Wait()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("waiting Insert = %v, want context.Canceled", err)
		}
		close(hold)
		synctest.Wait()
		if n := l.Guard().Len(); n != 2 {
			t.Fatalf("guard holds %d copies, want 2", n)
		}
	})
}

// TestLoaderRebuildSizesFromKeys checks that a rebuilt guard is sized for
// the keys the old one holds, not for the slots it grew to, and keeps its
// configuration.
func TestLoaderRebuildSizesFromKeys(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	l := newTestLoader(t, s.withKeys(), []guard.Option{guard.WithCapacity(1000), guard.WithGrowThreshold(0.8), guard.WithMaxBytes(1 << 20)})
	seed := l.Guard().Seed()
	l.MarkReady()
	for i := range 50_000 {
		if err := l.Insert(ctx, i, func(context.Context) error { s.put(i, "r"); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 49_000 {
		if err := l.Delete(ctx, i, func(context.Context) (bool, error) { return s.del(i), nil }); err != nil {
			t.Fatal(err)
		}
	}
	grown := l.Stats().Guard.Slots
	if err := l.rebuildNow(ctx); err != nil {
		t.Fatal(err)
	}
	st := l.Stats().Guard
	g := l.Guard()
	t.Logf("grown guard: %d slots; rebuilt for %d keys: %d slots", grown, st.Items, st.Slots)
	// At most what a new guard for twice the keys takes: its shard count,
	// and so its smallest size, depends on GOMAXPROCS (4 shards per core
	// while they fit in 64 KiB).
	ref, err := guard.New(guard.WithCapacity(2000), guard.WithGrowThreshold(0.8))
	if err != nil {
		t.Fatal(err)
	}
	limit := ref.Stats().Slots
	ref.Close()
	if st.Items != 1000 || st.Slots > limit {
		t.Fatalf("rebuilt guard: %d keys in %d slots (the grown one had %d); want 1000 keys in at most %d, a new guard's for 2000", st.Items, st.Slots, grown, limit)
	}
	if st.MaxBytes != 1<<20 || st.GrowThreshold != 0.8 {
		t.Fatalf("rebuilt guard lost its configuration: memory cap %d, grow threshold %v", st.MaxBytes, st.GrowThreshold)
	}
	if g.Seed() != seed {
		t.Fatalf("rebuilt guard has seed %d, the first one had %d", g.Seed(), seed)
	}
}

// TestLoaderRebuildUnderTooSmallCap checks that a rebuild that cannot fit
// the keys under the memory cap fails with a clear error, once per backoff,
// and leaves the Loader answering correctly.
func TestLoaderRebuildUnderTooSmallCap(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	g, err := guard.New(guard.WithCapacity(1000), guard.WithShards(2))
	if err != nil {
		t.Fatal(err)
	}
	limit := g.Stats().Bytes + 1000
	g.Close()
	now := time.Unix(0, 0) // the clock stands still: the backoff never ends
	l := newTestLoader(t, s.withKeys(), []guard.Option{guard.WithCapacity(1000), guard.WithShards(2), guard.WithMaxBytes(limit)},
		withClock(func() time.Time { return now }))
	l.MarkReady()
	for i := range 20_000 {
		if err := l.Insert(ctx, i, func(context.Context) error { s.put(i, "r"); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for l.Stats().Rebuilding {
		runtime.Gosched()
	}
	st := l.Stats()
	if st.Rebuilds != 0 || st.RebuildErrors != 1 || st.PassThroughShards == 0 {
		t.Fatalf("rebuilds %d, errors %d, pass-through shards %d; want 0, 1 (then backing off), > 0", st.Rebuilds, st.RebuildErrors, st.PassThroughShards)
	}
	for i := range 20_000 {
		if _, err := l.Get(ctx, i); err != nil {
			t.Fatalf("Get(%d) = %v", i, err)
		}
	}
}

// TestLoaderReplicasStress runs several simulated replicas over one
// in-memory table with a commit log as change feed. Each replica has a
// Loader with an attached feed that applies the log in order (skipping its
// own inserts) some entries behind, and workers that insert rows, delete
// rows of any origin (rows that existed before warm-up, rows just created
// by other replicas whose creation the replica has not applied yet), and
// look rows up.
//
// The keys come in clusters of four that hash alike (clusterCodec), so that
// no guard can tell them apart, inserted one after the other: a removal of
// a key the guard does not hold takes a live cluster mate's copy every
// time, whatever the guard's false-positive rate.
//
// Every ErrNotFound is checked against the table: a row that existed for
// the whole Get, and that the replica knew of when the Get began (its own
// insert, or a creation its feed had applied), must be found. At the end
// every feed catches up and every row must be found on every replica.
func TestLoaderReplicasStress(t *testing.T) {
	seed := testrand.Seed(t)
	const replicas = 3
	total := 30_000 // operations, shared by all workers whatever GOMAXPROCS
	if testing.Short() {
		total = 6_000
	}
	workers := max(runtime.GOMAXPROCS(0), 2)
	perWorker := total / (replicas * workers)
	opts := []guard.Option{guard.WithSeed(seed), guard.WithShards(1), guard.WithCapacity(64)}
	keys := make([]int, total/2)
	for i := range keys {
		keys[i] = i + 1
	}

	tbl := newLogTable()
	var next atomic.Int64 // index of the next unused key
	for range 200 {       // rows that exist before any replica warms up
		tbl.insert(keys[next.Add(1)-1], -1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drain := make(chan struct{}) // closed when the workers are done: feeds catch up
	errc := make(chan error, replicas*(workers+1))
	var feeds, work sync.WaitGroup
	var checkedNotFound atomic.Int64
	reps := make([]*replica, replicas)
	for r := range replicas {
		g, err := guard.New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		l, err := New(g, getter(tbl.lookup))
		if err != nil {
			t.Fatal(err)
		}
		l.codec = clusterCodec
		defer l.Close()
		feed, err := l.AttachFeed()
		if err != nil {
			t.Fatal(err)
		}
		rep := &replica{id: r, l: l, feed: feed, t: tbl}
		reps[r] = rep
		feeds.Go(func() {
			if err := rep.follow(ctx, drain, rand.New(rand.NewPCG(seed, uint64(r)+50))); err != nil && ctx.Err() == nil {
				errc <- err
			}
		})
		for w := range workers {
			work.Go(func() {
				rnd := rand.New(rand.NewPCG(seed, uint64(r*100+w)))
				for range perWorker {
					switch x := rnd.IntN(10); {
					case x < 3:
						i := int(next.Add(1)) - 1
						if i >= len(keys) {
							continue
						}
						k := keys[i]
						err := l.Insert(ctx, k, func(context.Context) error { tbl.insert(k, r); return nil })
						if err != nil {
							errc <- err
							return
						}
					case x < 5:
						k, ok := tbl.randomRow(rnd, rnd.IntN(2) == 0)
						if !ok {
							continue
						}
						err := l.Delete(ctx, k, func(context.Context) (bool, error) { return tbl.delete(k, r), nil })
						if err != nil {
							errc <- err
							return
						}
					default:
						k, ok := tbl.randomRow(rnd, false)
						if !ok {
							continue
						}
						before := tbl.state(k)
						known := before.exists && (before.origin == r || before.seq <= rep.applied.Load())
						_, err := l.Get(ctx, k)
						if errors.Is(err, ErrNotFound) {
							checkedNotFound.Add(1)
							if after := tbl.state(k); known && after == before {
								errc <- fmt.Errorf("replica %d: Get(%d) = ErrNotFound for a row it knew of (created at %d by %d, applied up to %d)",
									r, k, before.seq, before.origin, rep.applied.Load())
								return
							}
						} else if err != nil {
							errc <- err
							return
						}
					}
				}
			})
		}
	}
	work.Wait()
	close(drain)
	end := int64(tbl.len())
	for _, rep := range reps {
		for rep.applied.Load() < end && ctx.Err() == nil && len(errc) == 0 {
			runtime.Gosched()
		}
	}
	rows, _ := tbl.read()
	for _, rep := range reps {
		for _, k := range rows {
			if _, err := rep.l.Get(ctx, k); err != nil {
				t.Errorf("replica %d after catching up: Get(%d) = %v", rep.id, k, err)
				break
			}
		}
	}
	cancel()
	feeds.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	t.Logf("%d replicas × %d workers, %d ops each; %d log entries, %d rows at the end; %d ErrNotFound checked against the table",
		replicas, workers, perWorker, end, len(rows), checkedNotFound.Load())
}

// clusterCodec hashes integer keys so that the keys of each cluster of
// four (k/4 equal) get the same hash: no guard can tell them apart, so a
// removal of a key the guard does not hold takes a cluster mate's copy.
var clusterCodec = keyCodec[int]{hash: func(_ *guard.Guard, k int) uint64 { return testrand.Mix(uint64(k/4) + 1) }}

// logTable is a table whose commits append to a log, the change feed.
type logTable struct {
	mu    sync.Mutex
	rows  map[int]rowState
	keys  []int // of rows, for picking at random; may hold deleted keys
	log   []logEntry
	grown chan struct{} // closed and replaced on every append
}

type rowState struct {
	exists bool
	seq    int64 // log position of the creation
	origin int   // replica that created it, -1 before warm-up
}

type logEntry struct {
	key     int
	deleted bool
	origin  int
}

func newLogTable() *logTable {
	return &logTable{rows: map[int]rowState{}, grown: make(chan struct{})}
}

func (t *logTable) appendLocked(e logEntry) int64 {
	t.log = append(t.log, e)
	close(t.grown)
	t.grown = make(chan struct{})
	return int64(len(t.log))
}

func (t *logTable) insert(k, origin int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rows[k].exists {
		return
	}
	seq := t.appendLocked(logEntry{key: k, origin: origin})
	t.rows[k] = rowState{exists: true, seq: seq, origin: origin}
	t.keys = append(t.keys, k)
}

func (t *logTable) delete(k, origin int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.rows[k].exists {
		return false
	}
	t.appendLocked(logEntry{key: k, deleted: true, origin: origin})
	delete(t.rows, k)
	return true
}

func (t *logTable) state(k int) rowState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rows[k]
}

// randomRow returns a key that was inserted, among the last 8 if recent;
// its row may have been deleted since.
func (t *logTable) randomRow(r *rand.Rand, recent bool) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.keys) == 0 {
		return 0, false
	}
	if recent {
		n := min(len(t.keys), 8)
		return t.keys[len(t.keys)-n+r.IntN(n)], true
	}
	return t.keys[r.IntN(len(t.keys))], true
}

func (t *logTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.log)
}

func (t *logTable) lookup(_ context.Context, k int) (string, error) {
	if !t.state(k).exists {
		return "", ErrNotFound
	}
	return "row", nil
}

// read returns the table's keys and the log position they reflect, as a
// snapshot read does.
func (t *logTable) read() ([]int, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ks []int
	for k, st := range t.rows {
		if st.exists {
			ks = append(ks, k)
		}
	}
	return ks, int64(len(t.log))
}

// next waits until the log holds more than pos+lag entries (or, once drain
// is closed, more than pos) and returns the entry after pos.
func (t *logTable) next(ctx context.Context, drain <-chan struct{}, pos, lag int64) (logEntry, error) {
	for {
		t.mu.Lock()
		n := int64(len(t.log))
		select {
		case <-drain:
			lag = 0
		default:
		}
		if n > pos+lag {
			e := t.log[pos]
			t.mu.Unlock()
			return e, nil
		}
		grown := t.grown
		t.mu.Unlock()
		select {
		case <-grown:
		case <-drain:
		case <-ctx.Done():
			return logEntry{}, ctx.Err()
		}
	}
}

// replica follows a logTable into its Loader, as the postgres follower
// does with notifications.
type replica struct {
	id      int
	l       *Loader[int, string]
	feed    *Feed[int]
	t       *logTable
	applied atomic.Int64 // log position applied
}

// follow resyncs the replica's Loader from a read of the table, then
// applies the log after it, each entry a random 0 to 31 entries behind the
// head (as a notification is delayed), until ctx ends.
func (rp *replica) follow(ctx context.Context, drain <-chan struct{}, rnd *rand.Rand) error {
	var pos int64
	err := rp.feed.Resync(ctx, func(ctx context.Context, add func(int) error) error {
		ks, p := rp.t.read()
		pos = p
		for _, k := range ks {
			if err := add(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	rp.applied.Store(pos)
	rp.feed.MarkReady()
	for {
		e, err := rp.t.next(ctx, drain, pos, rnd.Int64N(32))
		if err != nil {
			return err
		}
		pos++
		if e.origin != rp.id || e.deleted { // this replica's Insert added its own rows
			if err := rp.feed.Apply(Change[int]{Key: e.key, Deleted: e.deleted}); err != nil {
				return err
			}
		}
		rp.applied.Store(pos)
	}
}

// TestLoaderErrors checks the errors a user sees: the sentinels compare
// with errors.Is, and no message repeats a prefix.
func TestLoaderErrors(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	l := newTestLoader(t, s, nil)
	l.MarkReady()
	l.Close()
	err := l.Insert(ctx, 1, func(context.Context) error { return nil })
	if !errors.Is(err, ErrClosed) || err.Error() != "guarded: closed" {
		t.Fatalf("Insert after Close = %q, want ErrClosed", err)
	}
	if !errors.Is(err, guard.ErrClosed) || errors.Is(err, guard.ErrFull) {
		t.Fatalf("Insert after Close = %q: errors.Is(guard.ErrClosed) should hold, and only it", err)
	}
	if err := l.Fill(ctx, seqOf([]int{1})); !errors.Is(err, ErrClosed) || err.Error() != "guarded: closed" {
		t.Fatalf("Fill after Close = %q, want ErrClosed", err)
	}
	boom := errors.New("userdb: list ids: connection refused")
	l2 := newTestLoader(t, s, nil)
	err = l2.Fill(ctx, func(yield func(int, error) bool) { yield(0, boom) })
	if !errors.Is(err, boom) || err.Error() != "guarded: fill: userdb: list ids: connection refused" {
		t.Fatalf("Fill with a failing source = %q", err)
	}
}

// TestLoaderRebuildGuard checks WithRebuildGuard: the rebuild uses the
// function's guard, and refuses one whose seed differs from the old
// guard's (keys would hash differently in the two).
func TestLoaderRebuildGuard(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	for i := range 100 {
		s.put(i, "r")
	}
	var asked atomic.Int64
	l := newTestLoader(t, s.withKeys(), []guard.Option{guard.WithCapacity(1000)}, WithRebuildGuard(func(old *guard.Guard, n int) (*guard.Guard, error) {
		asked.Add(1)
		return old.Fresh(n, guard.WithShards(3))
	}))
	if err := l.Fill(ctx, s.keys(ctx)); err != nil {
		t.Fatal(err)
	}
	if err := l.rebuildNow(ctx); err != nil {
		t.Fatal(err)
	}
	if asked.Load() != 1 || l.Guard().Shards() != 3 || l.Guard().Len() != 100 {
		t.Fatalf("rebuild: asked %d times, %d shards, %d keys; want 1, 3, 100", asked.Load(), l.Guard().Shards(), l.Guard().Len())
	}
	bad := newTestLoader(t, s.withKeys(), nil, WithRebuildGuard(func(old *guard.Guard, n int) (*guard.Guard, error) {
		return guard.New(guard.WithCapacity(n), guard.WithSeed(old.Seed()+1))
	}))
	if err := bad.rebuildNow(ctx); err == nil || !strings.Contains(err.Error(), "seed") {
		t.Fatalf("rebuild with a guard of another seed = %v, want an error about the seed", err)
	}
}

// TestInsertsAheadOfTheFeedOweCopies: with a change feed, this process
// deletes a key and inserts it again through the Loader more times than
// guard.MaxCopies before the stream brings the first deletion (each
// Insert adds a copy before it writes; the feed removes nothing for a
// Delete and applies every deletion itself). The copies the guard refuses
// are owed, and the feed's deletions take them first: the key stays
// present while its row exists, and a deletion past the copies takes no
// colliding key's copy. A collision with y makes a copy taken from the
// wrong key visible.
func TestInsertsAheadOfTheFeedOweCopies(t *testing.T) {
	ctx := context.Background()
	const y = 1
	k := collidingKey(t, y)
	s := newMemStore[int]()
	l := newTestLoader(t, s, collisionOpts)
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	if err := feed.Apply(Change[int]{Key: y}); err != nil { // y's row, read by the feed
		t.Fatal(err)
	}
	feed.MarkReady()
	const rounds = 2*guard.MaxCopies + 1
	for range rounds { // insert k; delete k, which the feed will bring later
		if err := l.Insert(ctx, k, func(context.Context) error { s.put(k, "k"); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := l.Delete(ctx, k, func(context.Context) (bool, error) { s.del(k); return true, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Insert(ctx, k, func(context.Context) error { s.put(k, "k"); return nil }); err != nil { // the last insert: k's row exists
		t.Fatal(err)
	}
	// The stream: every insert is this process's own (skipped), every
	// deletion applied.
	for i := range rounds {
		if err := feed.Apply(Change[int]{Key: k, Deleted: true}); err != nil {
			t.Fatal(err)
		}
		if !l.MayContain(k) {
			t.Fatalf("k, whose row exists, reads absent after %d of the feed's %d deletions", i+1, rounds)
		}
		if !l.MayContain(y) {
			t.Fatalf("y reads absent after %d of the feed's deletions of k: one took y's copy", i+1)
		}
	}
	// And k's last row deleted: y keeps its copy.
	if err := feed.Apply(Change[int]{Key: k, Deleted: true}); err != nil {
		t.Fatal(err)
	}
	if !l.MayContain(y) {
		t.Fatal("y reads absent after the last deletion of k")
	}
}

// identicalKey returns a key that a guard made with collisionOpts cannot
// tell from y at all: the same fingerprint, buckets and tail, so that
// MaxCopies copies of y refuse a copy of it.
func identicalKey(t *testing.T, y int) int {
	t.Helper()
	return keyMatching(t, y, func(k int) bool {
		g := mustNew(t, collisionOpts...)
		for range guard.MaxCopies {
			if err := g.AddHash(hashUint64(g, uint64(y))); err != nil {
				t.Fatal(err)
			}
		}
		return errors.Is(g.AddHash(hashUint64(g, uint64(k))), guard.ErrTooManyCopies)
	})
}

// TestRefusedCopyReadsPresent: the guard refuses a copy of k because it
// holds MaxCopies copies of y, a key it cannot tell from k. The copies are
// y's: this process inserted and deleted y four times ahead of its feed,
// whose deletions then take every one of them. k's row exists, so k must
// still read present: the Loader owes k's refused copy (view.over) and
// lookups count it. Before they did, MayContain, Get and GetMany answered
// absent for k once y's copies were gone.
func TestRefusedCopyReadsPresent(t *testing.T) {
	ctx := context.Background()
	const y = 1
	k := identicalKey(t, y)
	s := newMemStore[int]()
	l := newTestLoader(t, s, collisionOpts)
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	feed.MarkReady()
	for range guard.MaxCopies { // y inserted and deleted; the feed brings the deletions later
		if err := l.Insert(ctx, y, func(context.Context) error { s.put(y, "y"); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := l.Delete(ctx, y, func(context.Context) (bool, error) { return s.del(y), nil }); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Insert(ctx, k, func(context.Context) error { s.put(k, "k"); return nil }); err != nil {
		t.Fatal(err)
	}
	if st := l.Guard().Stats(); st.DuplicatesRefused == 0 {
		t.Fatalf("the guard took k's copy (%+v): the test needs it refused", st)
	}
	for range guard.MaxCopies { // the stream catches up: y's deletions
		if err := feed.Apply(Change[int]{Key: y, Deleted: true}); err != nil {
			t.Fatal(err)
		}
	}
	if l.Guard().ContainsHash(l.Hash(k)) {
		t.Fatal("the guard still holds a copy that k matches: the test needs them gone")
	}
	if !l.MayContain(k) {
		t.Error("MayContain(k) = false, and k's row exists")
	}
	if _, err := l.Get(ctx, k); err != nil {
		t.Errorf("Get(k) = %v, and k's row exists", err)
	}
	if _, errs := l.GetMany(ctx, []int{k}); errs[0] != nil {
		t.Errorf("GetMany(k) = %v, and k's row exists", errs[0])
	}
	if l.MayContain(y) {
		t.Log("y reads present: a false positive, allowed")
	}
}
