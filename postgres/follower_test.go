package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
)

// replica is one simulated process: its own pool, Loader and Follower.
type replica struct {
	id       string
	pool     *pgxpool.Pool
	loader   *guarded.Loader[int64, string]
	follower *Follower[int64]
	stop     context.CancelFunc
	done     chan error
}

func parseID(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

// startReplica starts a replica and waits until its follower follows.
func startReplica(t *testing.T, dsn, id string) *replica {
	t.Helper()
	return startReplicaVia(t, dsn, dsn, id)
}

// startReplicaVia is startReplica with the follower connecting to
// followDSN (through a proxy, say) and the given follower options.
func startReplicaVia(t *testing.T, dsn, followDSN, id string, opts ...Option) *replica {
	t.Helper()
	return startReplicaOn(t, dsn, followDSN, "users", id, opts...)
}

// startReplicaOn is startReplicaVia for a table other than users (with the
// same columns).
func startReplicaOn(t *testing.T, dsn, followDSN, table, id string, opts ...Option) *replica {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(guard.WithCapacity(10_000))
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(ctx context.Context, id int64) (string, error) {
		var name string
		err := pool.QueryRow(ctx, `SELECT name FROM `+table+` WHERE id = $1`, id).Scan(&name)
		return name, err
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, string](lookup),
		guarded.WithNotFound(func(err error) bool { return errors.Is(err, pgx.ErrNoRows) }),
		guarded.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]Option{WithOrigin(id), WithBackoff(20 * time.Millisecond)}, opts...)
	f, err := NewFollower(l, followDSN, table, "id", parseID, opts...)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{id: id, pool: pool, loader: l, follower: f}
	r.run()
	t.Cleanup(func() {
		r.halt()
		l.Close()
		pool.Close()
	})
	r.waitFollowing(t)
	return r
}

func (r *replica) run() {
	ctx, cancel := context.WithCancel(context.Background())
	r.stop, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.follower.Run(ctx) }()
}

// halt stops the follower, as a crashed listener would.
func (r *replica) halt() {
	if r.stop != nil {
		r.stop()
		<-r.done
		r.stop = nil
	}
}

func (r *replica) waitFollowing(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for r.follower.Stats().State != Following || !r.loader.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s never followed: %+v", r.id, r.follower.Stats())
		}
		runtime.Gosched()
	}
}

func (r *replica) insert(ctx context.Context, id int64) error {
	return r.loader.Insert(ctx, id, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if err := r.follower.Tag(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO users (id, name) VALUES ($1, $2)`, id, r.id)
			return err
		})
	})
}

func (r *replica) delete(ctx context.Context, id int64) error {
	return r.loader.Delete(ctx, id, func(ctx context.Context) (bool, error) {
		var n int64
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if err := r.follower.Tag(ctx, tx); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `DELETE FROM users WHERE id = $1`, id)
			n = tag.RowsAffected()
			return err
		})
		return n > 0, err
	})
}

// setupUsers creates the users table with the trigger in a fresh schema
// and returns a DSN whose connections use that schema.
func setupUsers(t *testing.T, seed int) string {
	t.Helper()
	ctx := context.Background()
	db, _ := pgConn(t)
	if _, err := db.Exec(ctx, `CREATE TABLE users (id BIGINT PRIMARY KEY, name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO users SELECT g, 'seed' FROM generate_series(1, $1::int) g`, seed); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, db, "users", "id"); err != nil {
		t.Fatal(err)
	}
	if err := Publish(ctx, db, "users", "id"); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := db.Config()
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&search_path=%s", cfg.User, cfg.Host, cfg.Port, cfg.Database, schema)
}

// converge waits until every replica's guard holds every live id, and at
// least one copy for each: every creation added one copy (the writer's
// Loader, the others' feeds, or a resync's read) and every delete removed
// one, whichever replica made it. A missing copy would be a false negative
// waiting for a colliding key. An insert through a replica that commits
// while that replica's resync reads the table is counted twice (a false
// positive until the next resync); converge logs such extra copies.
func converge(t *testing.T, replicas []*replica, live func() []int64) time.Duration {
	t.Helper()
	start := time.Now()
	ids := live()
	for _, r := range replicas {
		r.waitFollowing(t)
		for _, id := range ids {
			for !r.loader.MayContain(id) {
				if time.Since(start) > 30*time.Second {
					t.Fatalf("replica %s never learned of id %d: %+v", r.id, id, r.follower.Stats())
				}
				runtime.Gosched()
			}
		}
		for r.loader.Guard().Len() < len(ids) {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("replica %s holds %d copies for %d live ids: %+v", r.id, r.loader.Guard().Len(), len(ids), r.follower.Stats())
			}
			runtime.Gosched()
		}
		if extra := r.loader.Guard().Len() - len(ids); extra > 0 {
			t.Logf("replica %s: %d extra copies (inserts that raced a resync)", r.id, extra)
		}
	}
	return time.Since(start)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	slices.Sort(ds)
	return ds[int(p*float64(len(ds)-1))]
}

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

// TestFollowerBehindPassesThrough gives a follower a max lag no
// notification can meet: after the first late notification it must
// invalidate its Loader, so that lookups pass through.
func TestFollowerBehindPassesThrough(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 10)
	r := startReplica(t, dsn, "A")
	r.halt()
	f, err := NewFollower(r.loader, dsn, "users", "id", parseID, WithOrigin("A"), WithMaxLag(time.Nanosecond))
	if err != nil {
		t.Fatal(err)
	}
	r.follower = f
	r.run()
	// The marker's own round trip is later than 1 ns: the follower may
	// be behind as soon as it has read the table.
	for deadline := time.Now().Add(30 * time.Second); f.Stats().Resyncs == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("follower never read the table: %+v", f.Stats())
		}
		runtime.Gosched()
	}
	w, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	if _, err := w.Exec(ctx, `INSERT INTO users VALUES (11, 'late')`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.Stats().State != Behind {
		if time.Now().After(deadline) {
			t.Fatalf("follower never fell behind: %+v", f.Stats())
		}
		runtime.Gosched()
	}
	if r.loader.Ready() {
		t.Fatal("a follower that is behind left its Loader ready")
	}
	if _, err := r.loader.Get(ctx, 11); err != nil {
		t.Fatalf("Get(11) while behind = %v", err)
	}
	t.Logf("lag of the late notification: %v", f.Stats().Lag)
}

// viaProxy returns a proxy in front of the server of dsn and dsn rewritten
// to go through it.
func viaProxy(t *testing.T, dsn string) (*tcpproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tcpproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	return p, u.String()
}

// TestFollowerBlackhole puts replica A's follower behind a proxy that
// stops forwarding bytes without closing anything, as a NAT that dropped
// the connection's state would. A must notice through its heartbeat and
// pass lookups through within the heartbeat deadline (plus one wait),
// rows committed on replica B during the blackout must read as present on
// A from then on, and once the proxy forwards again A must resync and
// follow.
func TestFollowerBlackhole(t *testing.T) {
	for _, m := range followModes {
		t.Run(m.name, func(t *testing.T) { testFollowerBlackhole(t, m.opts, m.resumes) })
	}
}

func testFollowerBlackhole(t *testing.T, opts []Option, resumes bool) {
	ctx := context.Background()
	dsn := setupUsers(t, 100)
	p, viaDSN := viaProxy(t, dsn)
	const heartbeat = 100 * time.Millisecond
	a := startReplicaVia(t, dsn, viaDSN, "A", append([]Option{WithHeartbeat(heartbeat)}, opts...)...)
	b := startReplicaVia(t, dsn, dsn, "B", opts...)
	deadline := 3 * heartbeat
	p.Stall()
	stalled := time.Now()
	var ids []int64
	for i := range 20 {
		id := int64(5000 + i)
		if err := b.insert(ctx, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for a.loader.Ready() {
		if time.Since(stalled) > 10*deadline {
			t.Fatalf("A still ready %v after the blackout began: %+v", time.Since(stalled), a.follower.Stats())
		}
		runtime.Gosched()
	}
	passThrough := time.Since(stalled)
	t.Logf("blackout to pass-through: %v (heartbeat %v, deadline %v); A: %+v", passThrough, heartbeat, deadline, a.follower.Stats())
	if passThrough > deadline+heartbeat/2 {
		t.Errorf("pass-through %v after the blackout, want within the deadline %v (and scheduling slack)", passThrough, deadline)
	}
	check := func(when string) {
		t.Helper()
		for _, id := range ids {
			if _, err := a.loader.Get(ctx, id); err != nil {
				t.Fatalf("%s: A.Get(%d) of a row committed on B = %v", when, id, err)
			}
		}
	}
	check("during the blackout")
	// Behind first (the oldest heartbeat out is older than the max lag),
	// then dead (nothing at all for the deadline): the session ends, and
	// the next one must resync.
	for a.follower.Stats().HeartbeatsLost == 0 {
		if time.Since(stalled) > 10*deadline {
			t.Fatalf("A's session still alive %v after the blackout began: %+v", time.Since(stalled), a.follower.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("blackout to the session given up: %v", time.Since(stalled))
	check("after the session was given up")
	p.Resume()
	resumed := time.Now()
	a.waitFollowing(t)
	t.Logf("resume to following: %v; A: %+v", time.Since(resumed), a.follower.Stats())
	check("after the blackout")
	for i := range 5 {
		id := int64(6000 + i)
		if err := b.insert(ctx, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	converge(t, []*replica{a, b}, func() []int64 {
		live := slices.Clone(ids)
		for id := range int64(100) {
			live = append(live, id+1) // seeded
		}
		return live
	})
	if st := a.follower.Stats(); st.HeartbeatsLost == 0 {
		t.Fatalf("A did not lose its heartbeat: %+v", st)
	}
	checkResumed(t, a, resumes)
}

// TestFollowerCannotListen points a follower at a connection that accepts
// LISTEN and delivers nothing (a proxy that drops notification messages,
// as a PgBouncer in transaction pooling mode does): Run must fail with
// ErrNoNotifications within the heartbeat deadline instead of leaving the
// Loader passing through for good.
func TestFollowerCannotListen(t *testing.T) {
	dsn := setupUsers(t, 10)
	p, viaDSN := viaProxy(t, dsn)
	p.DropPostgresMessages('A') // NotificationResponse
	l := emptyLoader(t)
	defer l.Close()
	f, err := NewFollower(l, viaDSN, "users", "id", parseID, WithNotify(), WithHeartbeat(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err = f.Run(ctx)
	t.Logf("Run = %v after %v", err, time.Since(start))
	if !errors.Is(err, ErrNoNotifications) {
		t.Fatalf("Run through a connection that delivers no notifications = %v, want ErrNoNotifications", err)
	}
	if l.Ready() {
		t.Fatal("the Loader is ready though its follower never received anything")
	}
}

// TestFollowerNotInstalled starts a follower on a table without the
// trigger (Install forgotten, or run for another name): it would hear its
// own heartbeats and nothing else, so Run must refuse with
// ErrNotInstalled instead of following.
func TestFollowerNotInstalled(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	if _, err := db.Exec(ctx, `CREATE TABLE users (id BIGINT PRIMARY KEY, name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := db.Config()
	dsn := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&search_path=%s", cfg.User, cfg.Host, cfg.Port, cfg.Database, schema)
	for _, table := range []string{"users", "nosuchtable"} {
		l := emptyLoader(t)
		f, err := NewFollower(l, dsn, table, "id", parseID, WithNotify(), WithHeartbeat(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = f.Run(rctx)
		cancel()
		l.Close()
		t.Logf("%s: Run = %v", table, err)
		if !errors.Is(err, ErrNotInstalled) {
			t.Fatalf("Run on %s without the trigger = %v, want ErrNotInstalled", table, err)
		}
	}
}

// emptyLoader returns a Loader over a new default guard whose store finds
// nothing: what a follower test needs when it looks at the follower only.
// The caller closes it.
func emptyLoader(t testing.TB) *guarded.Loader[int64, string] {
	t.Helper()
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, string](func(context.Context, int64) (string, error) { return "", nil }))
	if err != nil {
		t.Fatal(err)
	}
	return l
}
