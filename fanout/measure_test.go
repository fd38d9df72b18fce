package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/loadgen"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// measuring skips the test unless CUCKOOGUARD_MEASURE is set: these run
// for minutes and report figures; they check correctness, never timings.
func measuring(t *testing.T) {
	t.Helper()
	if os.Getenv("CUCKOOGUARD_MEASURE") == "" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure")
	}
	if _, err := exec.LookPath("pgbench"); err != nil {
		t.Skip("pgbench not found")
	}
}

// fleet is n replicas of the users table that follow it directly
// (postgres.Follower, a slot each) or through one relay.
type fleet struct {
	loaders []*guarded.Loader[int64, string]
	current []func() (postgres.State, time.Time) // each replica's state, and as of when it is current
	stops   []func()
}

func (fl *fleet) stop() {
	for i := len(fl.stops) - 1; i >= 0; i-- {
		fl.stops[i]()
	}
}

// waitCurrent waits until every replica follows with every change
// committed before the call, and returns how long that took.
func (fl *fleet) waitCurrent(t *testing.T, limit time.Duration) time.Duration {
	t.Helper()
	since := time.Now()
	for i, cur := range fl.current {
		for {
			st, asOf := cur()
			if st == postgres.Following && fl.loaders[i].Ready() && asOf.After(since) {
				break
			}
			if time.Since(since) > limit {
				t.Fatalf("replica %d never followed with the changes before %v (%v)", i, since.Format(time.StampMilli), st)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return time.Since(since)
}

// startFleet starts n replicas of users in mode "direct" or "relay", with
// the default heartbeat, or hb if not 0, and waits until they all follow.
func (e *env) startFleet(t *testing.T, mode string, n int, hb time.Duration) *fleet {
	t.Helper()
	ctx := context.Background()
	fl := &fleet{}
	var relay *Relay
	if mode == "relay" {
		r, err := NewRelay(relayed(t, e.dsn), "measure", e.nc, []follow.Table{{Table: "users", Key: "id"}}, e.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(e.relays, "measure") {
			e.relays = append(e.relays, "measure")
		}
		fl.stops = append(fl.stops, runUntilStopped(t, "relay", r.Run))
		relay = r
	}
	parse := func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
	for i := range n {
		pool, err := pgxpool.New(ctx, e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		g, err := guard.New(guard.WithCapacity(1 << 20))
		if err != nil {
			t.Fatal(err)
		}
		l, err := guarded.New(g, guarded.GetterFunc[int64, string](func(ctx context.Context, k int64) (string, error) {
			var s string
			err := pool.QueryRow(ctx, `SELECT name FROM users WHERE id = $1`, k).Scan(&s)
			return s, err
		}), guarded.WithNotFound(func(err error) bool { return errors.Is(err, pgx.ErrNoRows) }),
			guarded.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		var run func(context.Context) error
		if mode == "relay" {
			// Snapshots saved by the relay's replica, once a minute: the
			// deployment the README suggests.
			opts := append(slices.Clone(e.opts), WithOrigin(fmt.Sprintf("m%d", i)), WithRelay("measure"), WithSnapshots(e.bucket(), time.Minute, relay.Leading))
			if hb != 0 {
				opts = append(opts, WithHeartbeat(hb))
			}
			f, err := NewFollower(l, e.nc, relayed(t, e.dsn), "users", "id", parse, opts...)
			if err != nil {
				t.Fatal(err)
			}
			run = f.Run
			fl.current = append(fl.current, func() (postgres.State, time.Time) { st := f.Stats(); return st.State, st.CurrentAsOf })
		} else {
			// No origin: a temporary slot, gone with the session.
			var popts []postgres.Option
			if hb != 0 {
				popts = append(popts, postgres.WithHeartbeat(hb))
			}
			f, err := postgres.NewFollower(l, e.dsn, "users", "id", parse, popts...)
			if err != nil {
				t.Fatal(err)
			}
			run = f.Run
			fl.current = append(fl.current, func() (postgres.State, time.Time) { st := f.Stats(); return st.State, st.CurrentAsOf })
		}
		stopRun := runUntilStopped(t, mode+" follower", run)
		fl.loaders = append(fl.loaders, l)
		fl.stops = append(fl.stops, func() { stopRun(); l.Close(); pool.Close() })
	}
	fl.waitCurrent(t, time.Minute)
	return fl
}

// runUntilStopped runs run in a goroutine until the returned stop is
// called.
func runUntilStopped(t *testing.T, what string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v", what, err)
			}
		})
	}
}

// walsenderPIDs returns the server's walsenders and how many slots are
// active.
func walsenderPIDs(t *testing.T, db *pgx.Conn) (pids []int, activeSlots int) {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender'`)
	if err != nil {
		t.Fatal(err)
	}
	p32, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range p32 {
		pids = append(pids, int(p))
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE active`).Scan(&activeSlots); err != nil {
		t.Fatal(err)
	}
	return pids, activeSlots
}

// probeLag inserts one row at a time into users, every gap, until ctx is
// done, and returns, for every row and replica, the time from sending the
// INSERT (a commit of its own) to the replica's guard holding the key.
func probeLag(ctx context.Context, t *testing.T, dsn string, fl *fleet, first int64, gap time.Duration) []time.Duration {
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer c.Close(context.Background())
	var lags []time.Duration
	for id := first; ctx.Err() == nil; id++ {
		sent := time.Now()
		if _, err := c.Exec(context.Background(), `INSERT INTO users VALUES ($1, 'probe')`, id); err != nil {
			t.Error(err)
			return lags
		}
		seen := make([]bool, len(fl.loaders))
		for left := len(seen); left > 0; {
			for i, l := range fl.loaders {
				if !seen[i] && l.MayContain(id) {
					seen[i] = true
					left--
					lags = append(lags, time.Since(sent))
				}
			}
			if time.Since(sent) > time.Minute {
				t.Errorf("probe %d: %d replicas never held it", id, left)
				return lags
			}
			time.Sleep(50 * time.Microsecond)
		}
		time.Sleep(gap)
	}
	return lags
}

// percentile returns the p-th percentile of ds (sorted in place).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(p/100*float64(len(ds))))]
}

// expectFleetComplete checks every committed key of users on every
// replica, once they are all current.
func expectFleetComplete(t *testing.T, db *pgx.Conn, fl *fleet) {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Query(ctx, `SELECT id FROM users`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	fl.waitCurrent(t, time.Minute)
	wrong := 0
	for i, l := range fl.loaders {
		for _, id := range ids {
			if !l.MayContain(id) && l.Ready() {
				wrong++
				if wrong <= 5 {
					t.Errorf("replica %d: wrong 404 for committed key %d", i, id)
				}
			}
		}
	}
	t.Logf("  %d keys checked on %d replicas: %d wrong 404s", len(ids), len(fl.loaders), wrong)
}

// TestFanoutCost is the cost goal of the fan-out issue, side by side in
// one run: 1 and 8 replicas of users, following directly (a slot each)
// and through the relay, with the default heartbeat, and 8 through the
// relay with the old default of 1 s (what the tighter heartbeat costs).
// For each: the walsenders and active slots, the walsenders' CPU and all
// of the server's at a fixed 2,000 inserts/s into users, the lag from an
// INSERT to every replica's guard meanwhile, the most inserts per second
// into plain (a table nobody follows), and how long the replicas take to
// be current after the most inserts per second into users. Every
// committed key is checked on every replica at the end.
//
//	CUCKOOGUARD_MEASURE=1 go test -run TestFanoutCost -v -timeout 30m .
func TestFanoutCost(t *testing.T) {
	measuring(t)
	ctx := context.Background()
	e := newEnv(t)
	e.table(t, "users", 1000)
	e.exec(t, `CREATE TABLE plain (id bigint PRIMARY KEY, name text NOT NULL)`)
	db, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	cfg := db.Config()
	srv := loadgen.Server{Host: cfg.Host, Port: int(cfg.Port), User: cfg.User, Database: cfg.Database, SearchPath: "cg_fanout_" + e.id}
	const rate, d = 2000, 10 * time.Second
	rounds := 1
	if n, err := strconv.Atoi(os.Getenv("CUCKOOGUARD_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	type result struct {
		wcpu, scpu, plain []float64
		lags              []time.Duration
	}
	results := map[string]*result{}
	probeID := int64(1) << 50
	for round := range rounds {
		for _, run := range []struct {
			mode string
			n    int
			hb   time.Duration
		}{{"direct", 1, 0}, {"direct", 8, 0}, {"relay", 1, 0}, {"relay", 8, 0}, {"relay", 8, time.Second}} {
			mode, n := run.mode, run.n
			{
				fl := e.startFleet(t, mode, n, run.hb)
				pids, slots := walsenderPIDs(t, db)
				// A fixed write rate, with a lag probe beside it.
				before, self, server := 0.0, loadgen.CPUSeconds(os.Getpid()), loadgen.ServerCPUSeconds()
				for _, p := range pids {
					before += loadgen.CPUSeconds(p)
				}
				pctx, stopProbe := context.WithCancel(ctx)
				lagc := make(chan []time.Duration, 1)
				go func(first int64) { lagc <- probeLag(pctx, t, e.dsn, fl, first, 20*time.Millisecond) }(probeID)
				tps, err := loadgen.Inserts(srv, t.TempDir(), "users", 16, d, "-R", strconv.Itoa(rate))
				if err != nil {
					t.Fatal(err)
				}
				stopProbe()
				lags := <-lagc
				probeID += 1 << 20
				after := 0.0
				for _, p := range pids {
					after += loadgen.CPUSeconds(p)
				}
				wcpu, fcpu, scpu := (after-before)/d.Seconds(), (loadgen.CPUSeconds(os.Getpid())-self)/d.Seconds(), (loadgen.ServerCPUSeconds()-server)/d.Seconds()
				// The most inserts into a table nobody follows.
				plain, err := loadgen.Inserts(srv, t.TempDir(), "plain", 16, d)
				if err != nil {
					t.Fatal(err)
				}
				// The most inserts into users, and the catch-up after.
				full, err := loadgen.Inserts(srv, t.TempDir(), "users", 16, d)
				if err != nil {
					t.Fatal(err)
				}
				catchUp := fl.waitCurrent(t, 5*time.Minute)
				key := fmt.Sprintf("%s %d", mode, n)
				if run.hb != 0 {
					key += " hb " + run.hb.String()
				}
				r := results[key]
				if r == nil {
					r = &result{}
					results[key] = r
				}
				r.wcpu, r.scpu, r.plain, r.lags = append(r.wcpu, wcpu), append(r.scpu, scpu), append(r.plain, plain), append(r.lags, lags...)
				t.Logf("round %d, %s: %d walsenders, %d active slots; at %.0f inserts/s into users: walsenders %.3f cores, the whole server %.3f cores, this process %.3f cores, lag p50 %v p99 %v (%d probes × replicas); most inserts/s into plain %.0f; into users %.0f, all replicas current %v after",
					round+1, key, len(pids), slots, tps, wcpu, scpu, fcpu, percentile(lags, 50).Round(10*time.Microsecond), percentile(lags, 99).Round(10*time.Microsecond), len(lags), plain, full, catchUp.Round(time.Millisecond))
				expectFleetComplete(t, db, fl)
				fl.stop()
				// The next fleet starts once this one's walsenders are gone.
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
					if p, _ := walsenderPIDs(t, db); len(p) == 0 || time.Now().After(deadline) {
						break
					}
				}
			}
		}
	}
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	for _, mode := range []string{"direct", "relay"} {
		one, eight := results[mode+" 1"], results[mode+" 8"]
		t.Logf("%s: walsender cores at %d inserts/s, 8 replicas against 1: %.2f / %.2f = %.2fx; most inserts/s into plain, 8 against 1: %.0f / %.0f = %.2fx; lag p50/p99 with 1 replica %v/%v, with 8 %v/%v",
			mode, rate, mean(eight.wcpu), mean(one.wcpu), mean(eight.wcpu)/mean(one.wcpu), mean(eight.plain), mean(one.plain), mean(eight.plain)/mean(one.plain),
			percentile(one.lags, 50).Round(10*time.Microsecond), percentile(one.lags, 99).Round(10*time.Microsecond),
			percentile(eight.lags, 50).Round(10*time.Microsecond), percentile(eight.lags, 99).Round(10*time.Microsecond))
	}
	tight, loose := results["relay 8"], results["relay 8 hb 1s"]
	t.Logf("8 replicas through the relay, heartbeat %v against 1 s: the whole server %.3f / %.3f cores at %d inserts/s (+%.3f); most inserts/s into plain %.0f / %.0f = %.2fx",
		DefaultHeartbeat, mean(tight.scpu), mean(loose.scpu), rate, mean(tight.scpu)-mean(loose.scpu), mean(tight.plain), mean(loose.plain), mean(tight.plain)/mean(loose.plain))
}

// TestColdStartTenMillion is the cold-start goal of the fan-out issue: a
// new replica of a 10M-row table starts from the guard the relay's
// replica saved to the object store, applies what was committed after,
// and reads nothing from the table (pg_stat_user_tables).
//
//	CUCKOOGUARD_MEASURE=1 go test -run TestColdStartTenMillion -v -timeout 30m .
func TestColdStartTenMillion(t *testing.T) {
	measuring(t)
	ctx := context.Background()
	const rows = 10_000_000
	e := newEnv(t)
	start := time.Now()
	e.table(t, "users", rows)
	t.Logf("seeded %d rows in %v", rows, time.Since(start).Round(time.Second))
	r, _ := e.startRelay(t, "r_cold", "users")
	start = time.Now()
	a := e.startNode(t, "a", "users", WithSnapshots(e.bucket(), time.Second, r.Leading))
	t.Logf("the first replica read the table and followed in %v", time.Since(start).Round(time.Millisecond))
	for deadline := time.Now().Add(time.Minute); a.f.Stats().SnapshotsSaved == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the relay's replica saved no guard")
		}
	}
	// Changes after the saved guard, which the new replica takes from the
	// stream.
	e.exec(t, `INSERT INTO users SELECT g, 'after' FROM generate_series(20000001, 20001000) g`, `DELETE FROM users WHERE id <= 1000`)
	db, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	reads := func() (n int64) {
		// Stats reach the shared view when a backend goes idle, within a
		// second; exited backends flush theirs as they go.
		time.Sleep(1500 * time.Millisecond)
		db.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
		if err := db.QueryRow(ctx, `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'users' AND schemaname = current_schema()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := reads()
	start = time.Now()
	b := e.startNode(t, "b", "users")
	ready := time.Since(start)
	st := b.f.Stats()
	after := reads() // b's heartbeats and its own table's reads would show here

	t.Logf("a new replica of %d keys followed %v after it started, from the saved guard (%d starts from a saved guard, reads %v); the table's scans before and after: %d, %d",
		rows, ready.Round(time.Millisecond), st.SnapshotStarts, st.Reads, before, after)
	if st.SnapshotStarts != 1 || len(st.Reads) != 0 || after != before {
		t.Errorf("the new replica read the table: %+v, scans %d -> %d", st, before, after)
	}
	expectNoWrong404s(t, b, "started from the saved guard")
	expectNoWrong404s(t, a, "the relay's replica")
}
