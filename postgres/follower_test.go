package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// TestReplicasFollowEachOther runs three replicas on one database. It
// measures the staleness from a commit on one replica to visibility in
// another's guard, runs concurrent inserts, deletes and lookups through
// random replicas while asserting that no replica says ErrNotFound for a
// row committed longer ago than the bound, then kills a follower's backend
// and stops another's listener mid-run, and checks that all converge.
// followModes are the two ways a Follower follows: logical decoding
// resumes after a lost connection, NOTIFY reads the table again.
var followModes = []struct {
	name    string
	opts    []Option
	resumes bool
}{
	{"logical", nil, true},
	{"notify", []Option{WithNotify()}, false},
}

// checkResumed fails the test unless the Follower of replica r, which lost
// its connection, resumed where it stopped (logical decoding: no second
// full read) or read the table again (NOTIFY).
func checkResumed(t *testing.T, r *replica, resumes bool) {
	t.Helper()
	st := r.follower.Stats()
	switch {
	case st.Failures == 0:
		t.Fatalf("%s did not notice the lost connection: %+v", r.id, st)
	case resumes && (st.Resyncs != 1 || len(st.FullReads) != 1):
		t.Fatalf("%s read the table again after a lost connection instead of resuming: %+v", r.id, st)
	case !resumes && st.Resyncs < 2:
		t.Fatalf("%s did not read the table again after a lost connection: %+v", r.id, st)
	}
}

func TestReplicasFollowEachOther(t *testing.T) {
	for _, m := range followModes {
		t.Run(m.name, func(t *testing.T) { testReplicasFollowEachOther(t, m.opts, m.resumes) })
	}
}

func testReplicasFollowEachOther(t *testing.T, opts []Option, resumes bool) {
	ctx := context.Background()
	dsn := setupUsers(t, 1000)
	reps := []*replica{startReplicaVia(t, dsn, dsn, "A", opts...), startReplicaVia(t, dsn, dsn, "B", opts...), startReplicaVia(t, dsn, dsn, "C", opts...)}

	// Staleness: commit on A, poll B's guard.
	var stale []time.Duration
	for i := range 200 {
		id := int64(100_000 + i)
		if err := reps[0].insert(ctx, id); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		for !reps[1].loader.MayContain(id) {
			if time.Since(committed) > 10*time.Second {
				t.Fatalf("B never saw id %d", id)
			}
			runtime.Gosched()
		}
		stale = append(stale, time.Since(committed))
	}
	p50, p99 := percentile(stale, 0.5), percentile(stale, 0.99)
	bound := max(20*p99, 500*time.Millisecond)
	t.Logf("staleness A→B over 200 commits: p50 %v, p99 %v; bound used below %v", p50, p99, bound)

	// Live rows and when they were committed.
	var mu sync.Mutex
	committedAt := map[int64]time.Time{}
	for i := range 1000 {
		committedAt[int64(i+1)] = time.Time{} // seeded before the replicas started
	}
	for i := range 200 {
		committedAt[int64(100_000+i)] = time.Time{}
	}
	live := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		var ids []int64
		for id := range committedAt {
			ids = append(ids, id)
		}
		return ids
	}
	workload := func(base int64, ops int) {
		t.Helper()
		var wg sync.WaitGroup
		errc := make(chan error, 8)
		for w := range 4 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(base), uint64(w)))
				var mine []int64
				for i := range ops {
					rep := reps[r.IntN(len(reps))]
					switch x := r.IntN(10); {
					case x < 4:
						id := base + int64(w)*100_000 + int64(i)
						if err := rep.insert(ctx, id); err != nil {
							errc <- err
							return
						}
						mu.Lock()
						committedAt[id] = time.Now()
						mu.Unlock()
						mine = append(mine, id)
					case x < 5 && len(mine) > 0:
						j := r.IntN(len(mine))
						id := mine[j]
						mine = slices.Delete(mine, j, j+1)
						mu.Lock()
						delete(committedAt, id) // from now on it may read absent
						mu.Unlock()
						if err := rep.delete(ctx, id); err != nil {
							errc <- err
							return
						}
					default:
						ids := live()
						id := ids[r.IntN(len(ids))]
						mu.Lock()
						at, ok := committedAt[id]
						mu.Unlock()
						if _, err := rep.loader.Get(ctx, id); errors.Is(err, guarded.ErrNotFound) && ok && time.Since(at) > bound {
							mu.Lock()
							_, still := committedAt[id]
							mu.Unlock()
							if still {
								errc <- fmt.Errorf("replica %s: ErrNotFound for id %d committed %v ago (bound %v; follower %+v)",
									rep.id, id, time.Since(at), bound, rep.follower.Stats())
								return
							}
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
	}

	workload(1_000_000, 150)
	t.Logf("converged after the workload in %v", converge(t, reps, live))

	// Fault 1: kill B's LISTEN backend while writes go on.
	pid := reps[1].follower.Stats().BackendPID
	admin, _ := pgConn(t)
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	workload(2_000_000, 100)
	t.Logf("converged after pg_terminate_backend in %v; B: %+v", converge(t, reps, live), reps[1].follower.Stats())
	checkResumed(t, reps[1], resumes)

	// Fault 2: stop C's listener (notifications for C are lost), write,
	// restart it: it must resync.
	reps[2].halt()
	if reps[2].loader.Ready() {
		t.Fatal("C's Loader is ready with its follower stopped")
	}
	workload(3_000_000, 100)
	reps[2].run()
	t.Logf("converged after restarting C's follower in %v; C: %+v", converge(t, reps, live), reps[2].follower.Stats())

	for _, r := range reps {
		st := r.follower.Stats()
		t.Logf("replica %s: %+v, guard %d keys", r.id, st, r.loader.Guard().Len())
	}
}

// TestFollowerThroughput measures how many notifications per second one
// follower applies: 20,000 inserts committed at once by an untagged
// writer.
func TestFollowerThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	ctx := context.Background()
	dsn := setupUsers(t, 0)
	r := startReplica(t, dsn, "A")
	db, _ := pgConn(t)
	cfg := db.Config()
	_ = cfg
	w, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	const n = 20_000
	before := r.follower.Stats().Applied
	start := time.Now()
	if _, err := w.Exec(ctx, `INSERT INTO users SELECT g, 'bulk' FROM generate_series(1, $1::int) g`, n); err != nil {
		t.Fatal(err)
	}
	committed := time.Since(start)
	for r.follower.Stats().Applied < before+n {
		if time.Since(start) > time.Minute {
			t.Fatalf("applied %d of %d", r.follower.Stats().Applied-before, n)
		}
		runtime.Gosched()
	}
	took := time.Since(start)
	t.Logf("%d notifications: insert committed in %v, all applied after %v (%.0f notifications/s end to end)", n, committed, took, n/took.Seconds())
	for id := int64(1); id <= n; id++ {
		if !r.loader.MayContain(id) {
			t.Fatalf("id %d missing after the burst", id)
		}
	}
}

// TestResyncTime measures a follower's first resync of a table of 1M keys.
// It runs only with CUCKOOGUARD_MEASURE=1 (it takes seconds, more under
// -race).
func TestResyncTime(t *testing.T) {
	if os.Getenv("CUCKOOGUARD_MEASURE") == "" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure the resync of 1M keys")
	}
	ctx := context.Background()
	db, _ := pgConn(t)
	if _, err := db.Exec(ctx, `CREATE TABLE users (id BIGINT PRIMARY KEY, name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO users SELECT g, 'seed' FROM generate_series(1, 1000000) g`); err != nil {
		t.Fatal(err)
	}
	if err := Publish(ctx, db, "users", "id"); err != nil {
		t.Fatal(err)
	}
	var schema string
	db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema)
	cfg := db.Config()
	dsn := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&search_path=%s", cfg.User, cfg.Host, cfg.Port, cfg.Database, schema)
	start := time.Now()
	r := startReplica(t, dsn, "A")
	t.Logf("resync of 1,000,000 keys: %v (guard %d keys, %.1f bits/key)", time.Since(start), r.loader.Guard().Len(), r.loader.Guard().Stats().BitsPerItem)
}
