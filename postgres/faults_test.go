package postgres

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
)

// faultRun is one replica following a table while another process writes
// to it, and a checker reads the rows already committed through the
// follower's Loader. It counts wrong 404s: ErrNotFound for a row whose
// commit returned more than the staleness bound before the Get began.
type faultRun struct {
	t        *testing.T
	dsn      string
	a        *replica // follows
	bound    time.Duration
	mu       sync.Mutex
	ids      []int64     // committed, in commit order
	at       []time.Time // when each commit returned
	next     atomic.Int64
	gets     atomic.Int64
	wrong    atomic.Int64
	stale    atomic.Int64 // 404s within the bound (the notification delay)
	errs     atomic.Int64 // store errors (the database away)
	maxStale atomic.Int64 // longest commit-to-Get age of a 404, ns
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// The load next to the fault: checkers reading through A, and a writer
// committing a row every writerPause.
const (
	checkers    = 2
	writerPause = time.Millisecond
)

// startFaultRun seeds rows rows, starts replica A (heartbeat hb) and a
// writer and checkers on it. If proxy is not nil, it is set to a proxy
// that A's follower (and only it) connects through.
func startFaultRun(t *testing.T, rows int, hb time.Duration, proxy **tcpproxy.Proxy) *faultRun {
	t.Helper()
	dsn := setupUsers(t, rows)
	followDSN := dsn
	if proxy != nil {
		*proxy, followDSN = viaProxy(t, dsn)
	}
	start := time.Now()
	a := startReplicaVia(t, dsn, followDSN, "A", WithHeartbeat(hb))
	t.Logf("A following %d seeded rows after %v", rows, time.Since(start))
	r := &faultRun{t: t, dsn: dsn, a: a, bound: 3 * hb}
	r.next.Store(int64(rows) + 1_000_000)
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	w, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	r.wg.Go(func() { // the writer: another process, one row at a time
		defer w.Close(context.Background())
		for ctx.Err() == nil {
			id := r.next.Add(1)
			if _, err := w.Exec(ctx, `INSERT INTO users VALUES ($1, 'w')`, id); err != nil {
				if ctx.Err() == nil && w.IsClosed() {
					time.Sleep(10 * time.Millisecond)
					if c, err := pgx.Connect(ctx, dsn); err == nil {
						w = c
					}
				}
				continue // outcome unknown: not checked
			}
			r.committed(id)
			time.Sleep(writerPause)
		}
	})
	for c := range checkers { // the checkers: recent rows and any row
		r.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for ctx.Err() == nil {
				r.mu.Lock()
				n := len(r.ids)
				var id int64
				var at time.Time
				if n > 0 {
					i := n - 1 - rng.IntN(min(n, 50))
					if c == 1 {
						i = rng.IntN(n)
					}
					id, at = r.ids[i], r.at[i]
				}
				r.mu.Unlock()
				if n == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				r.check(ctx, id, at)
				// Leave the database (on the same cores, in tests) time to
				// deliver: while A passes through, every Get is a query.
				time.Sleep(200 * time.Microsecond)
			}
		})
	}
	t.Cleanup(r.halt)
	return r
}

func (r *faultRun) committed(ids ...int64) {
	now := time.Now()
	r.mu.Lock()
	for _, id := range ids {
		r.ids = append(r.ids, id)
		r.at = append(r.at, now)
	}
	r.mu.Unlock()
}

// check reads id, committed at at, through A's Loader.
func (r *faultRun) check(ctx context.Context, id int64, at time.Time) {
	begin := time.Now()
	_, err := r.a.loader.Get(ctx, id)
	r.gets.Add(1)
	switch {
	case err == nil:
	case errors.Is(err, guarded.ErrNotFound):
		age := begin.Sub(at)
		if age > r.bound {
			r.wrong.Add(1)
			r.t.Errorf("A: Get(%d) = ErrNotFound %v after its commit (bound %v); follower %+v", id, age, r.bound, r.a.follower.Stats())
		} else {
			r.stale.Add(1)
			for {
				m := r.maxStale.Load()
				if int64(age) <= m || r.maxStale.CompareAndSwap(m, int64(age)) {
					break
				}
			}
		}
	case ctx.Err() == nil:
		r.errs.Add(1)
	}
}

func (r *faultRun) halt() {
	r.stop()
	r.wg.Wait()
}

// waitReady waits until A's Loader is (or is not) ready and returns when.
func (r *faultRun) waitReady(ready bool, limit time.Duration) time.Time {
	r.t.Helper()
	start := time.Now()
	for r.a.loader.Ready() != ready {
		if time.Since(start) > limit {
			r.t.Fatalf("A ready %v for %v: %+v", !ready, limit, r.a.follower.Stats())
		}
		time.Sleep(100 * time.Microsecond)
	}
	return time.Now()
}

func (r *faultRun) report(what string) {
	r.halt()
	r.t.Logf("%s: %d Gets of committed rows, %d wrong 404s, %d 404s within the %v bound (oldest %v), %d store errors; A: %+v",
		what, r.gets.Load(), r.wrong.Load(), r.stale.Load(), r.bound, time.Duration(r.maxStale.Load()).Round(time.Millisecond),
		r.errs.Load(), r.a.follower.Stats())
}

// faultRows is how many rows the fault tests seed: 1M to measure, 10k in
// the everyday suite.
func faultRows() int {
	if os.Getenv("CUCKOOGUARD_MEASURE") != "" {
		return 1_000_000
	}
	return 10_000
}

// TestFaultBackendTerminated kills the follower's LISTEN backend with
// pg_terminate_backend while another process writes.
func TestFaultBackendTerminated(t *testing.T) {
	r := startFaultRun(t, faultRows(), 200*time.Millisecond, nil)
	time.Sleep(300 * time.Millisecond)
	admin, err := pgx.Connect(context.Background(), r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	fault := time.Now()
	var ok bool
	if err := admin.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, int(r.a.follower.Stats().BackendPID)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend: %v %v", ok, err)
	}
	pass := r.waitReady(false, 10*time.Second)
	back := r.waitReady(true, 60*time.Second)
	time.Sleep(300 * time.Millisecond)
	r.report("backend terminated")
	t.Logf("backend terminated: pass-through %v after the kill, following again %v after it", pass.Sub(fault), back.Sub(fault))
}

// TestFaultBulkInsert commits 200,000 rows in one transaction from
// another process: 200,000 notifications at once. The follower falls
// behind (lookups pass through) while it applies them, and no row is
// reported absent after the bound.
func TestFaultBulkInsert(t *testing.T) {
	if testing.Short() {
		t.Skip("200,000 rows")
	}
	const bulk = 200_000
	r := startFaultRun(t, faultRows(), 200*time.Millisecond, nil)
	time.Sleep(300 * time.Millisecond)
	w, err := pgx.Connect(context.Background(), r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	lo := r.next.Add(bulk+1) - bulk
	appliedBefore := r.a.follower.Stats().Applied // before: A applies while the commit returns
	start := time.Now()
	if _, err := w.Exec(context.Background(), `INSERT INTO users SELECT g, 'bulk' FROM generate_series($1::bigint, $2::bigint) g`, lo, lo+bulk-1); err != nil {
		t.Fatal(err)
	}
	commit := time.Now()
	ids := make([]int64, bulk)
	for i := range ids {
		ids[i] = lo + int64(i)
	}
	r.committed(ids...)
	// Applied counts the writer's rows too: at least the bulk's.
	for r.a.follower.Stats().Applied < appliedBefore+bulk {
		if time.Since(commit) > 2*time.Minute {
			t.Fatalf("A applied %d of %d bulk notifications in 2 minutes", r.a.follower.Stats().Applied-appliedBefore, bulk)
		}
		time.Sleep(time.Millisecond)
	}
	applied := time.Now()
	back := r.waitReady(true, time.Minute)
	time.Sleep(300 * time.Millisecond)
	r.report("bulk insert")
	t.Logf("bulk insert of %d rows: commit took %v; A had applied them %v after the commit returned and was ready %v after it",
		bulk, commit.Sub(start), applied.Sub(commit), back.Sub(commit))
	if r.wrong.Load() > 0 {
		t.Fatalf("%d wrong 404s", r.wrong.Load())
	}
}

// TestFaultServerRestart restarts the server (pg_ctl restart -m fast)
// under the follower. It needs the command that restarts the server the
// tests use, in CUCKOOGUARD_PG_RESTART (.ci/run sets it); the server is
// restarted, so nothing else may be using it.
func TestFaultServerRestart(t *testing.T) {
	cmd := os.Getenv("CUCKOOGUARD_PG_RESTART")
	if cmd == "" {
		t.Skip(`set CUCKOOGUARD_PG_RESTART to a shell command that restarts the test server, e.g. "runuser -u postgres -- pg_ctl -D /tmp/pgdata/data -m fast -w restart"`)
	}
	r := startFaultRun(t, faultRows(), 200*time.Millisecond, nil)
	time.Sleep(300 * time.Millisecond)
	fault := time.Now()
	out, err := exec.Command("sh", "-c", cmd).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	up := time.Now()
	if r.a.loader.Ready() && r.a.follower.Stats().Failures == 0 {
		t.Fatalf("A still ready after the restart without noticing it: %+v", r.a.follower.Stats())
	}
	back := r.waitReady(true, time.Minute)
	time.Sleep(300 * time.Millisecond)
	r.report("server restart")
	t.Logf("server restart: down and up again in %v; A following %v after the server was up", up.Sub(fault), back.Sub(up))
	if r.wrong.Load() > 0 {
		t.Fatalf("%d wrong 404s", r.wrong.Load())
	}
	// The shutdown ends the sessions with SQLSTATE 57P01 (the walsender
	// closes without a word; the regular connection says why): the
	// server's doing, never a silent connection (the first week in
	// production found it counted as heartbeat_lost).
	st := r.a.follower.Stats()
	t.Logf("failures by reason after the restart: %v", st.FailuresByReason)
	if st.FailuresByReason[ReasonHeartbeatLost] != 0 || st.FailuresByReason[ReasonTerminated] == 0 {
		t.Fatalf("failures by reason %v after a restart: want terminated, and no heartbeat_lost", st.FailuresByReason)
	}
}

// TestFaultBlackhole stalls the follower's connections (a proxy that stops
// forwarding without closing anything) for two seconds while another
// process writes: A must pass through within the heartbeat deadline and
// follow again after the proxy resumes.
func TestFaultBlackhole(t *testing.T) {
	var p *tcpproxy.Proxy
	const hb = 200 * time.Millisecond
	r := startFaultRun(t, faultRows(), hb, &p)
	time.Sleep(300 * time.Millisecond)
	fault := time.Now()
	p.Stall()
	pass := r.waitReady(false, 10*time.Second)
	time.Sleep(2 * time.Second)
	p.Resume()
	resumed := time.Now()
	back := r.waitReady(true, time.Minute)
	time.Sleep(300 * time.Millisecond)
	r.report("blackhole")
	t.Logf("blackhole: pass-through %v after the stall (deadline %v); following %v after the proxy resumed", pass.Sub(fault), 3*hb, back.Sub(resumed))
	if d := pass.Sub(fault); d > 3*hb+hb/2 {
		t.Errorf("pass-through %v after the stall, want within the deadline %v (and scheduling slack)", d, 3*hb)
	}
}
