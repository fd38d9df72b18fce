package postgres

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/internal/loadgen"
)

// measuring skips the test unless CUCKOOGUARD_MEASURE is set: these run
// for minutes and report figures; they check correctness, never timings.
func measuring(t *testing.T) {
	t.Helper()
	if os.Getenv("CUCKOOGUARD_MEASURE") == "" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure")
	}
}

// walsenders returns the PIDs of the server's walsenders.
func walsenders(t *testing.T, db *pgx.Conn) []int {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender'`)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out
}

// cpuDuring returns the CPU seconds the walsenders and this process used
// while run ran.
func cpuDuring(t *testing.T, db *pgx.Conn, run func()) (walsender, follower float64) {
	t.Helper()
	pids := walsenders(t, db)
	before, self := 0.0, loadgen.CPUSeconds(os.Getpid())
	for _, p := range pids {
		before += loadgen.CPUSeconds(p)
	}
	run()
	after := 0.0
	for _, p := range pids {
		after += loadgen.CPUSeconds(p)
	}
	return after - before, loadgen.CPUSeconds(os.Getpid()) - self
}

// pgbench runs pgbench against dsn's server for d with clients clients,
// each inserting random ids into table (of dsn's search_path), and
// returns the transactions per second it reports. args go to pgbench as
// they are (a fixed rate: "-R", "2000").
func pgbench(t *testing.T, dsn, table string, clients int, d time.Duration, args ...string) float64 {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	s := loadgen.Server{Host: cfg.Host, Port: int(cfg.Port), User: cfg.User, Database: cfg.Database, SearchPath: cfg.RuntimeParams["search_path"]}
	tps, err := loadgen.Inserts(s, t.TempDir(), table, clients, d, args...)
	if err != nil {
		t.Fatal(err)
	}
	return tps
}

// TestWriteTax is the write-tax goal of the logical-decoding issue: the
// insert throughput of a table that two replicas follow against an
// identical table that nothing follows, side by side, alternating, at 16
// and 64 concurrent writers (pgbench). It measures both kinds of follower:
// logical decoding, and the trigger with NOTIFY.
//
//	CUCKOOGUARD_MEASURE=1 go test -run TestWriteTax -v -timeout 30m .
func TestWriteTax(t *testing.T) {
	measuring(t)
	if _, err := exec.LookPath("pgbench"); err != nil {
		t.Skip("pgbench not found")
	}
	ctx := context.Background()
	dsn := setupUsers(t, 1000)
	db := connect(t, dsn)
	for _, q := range []string{
		`CREATE TABLE plain (id BIGINT PRIMARY KEY, name TEXT NOT NULL)`,
		`CREATE TABLE notified (id BIGINT PRIMARY KEY, name TEXT NOT NULL)`,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := Install(ctx, db, "notified", "id"); err != nil {
		t.Fatal(err)
	}
	// Two replicas follow users through logical decoding, and two follow
	// notified through NOTIFY. setupUsers gave users the NOTIFY trigger
	// too, for the tests of both kinds: here it must not cost users.
	var trig string
	if err := db.QueryRow(ctx, `SELECT tgname FROM pg_trigger WHERE tgrelid = 'users'::regclass AND NOT tgisinternal`).Scan(&trig); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `DROP TRIGGER `+pgx.Identifier{trig}.Sanitize()+` ON users`); err != nil {
		t.Fatal(err)
	}
	startReplicaVia(t, dsn, dsn, "L1")
	startReplicaVia(t, dsn, dsn, "L2")
	startReplicaOn(t, dsn, dsn, "notified", "N1", WithNotify())
	startReplicaOn(t, dsn, dsn, "notified", "N2", WithNotify())
	const d = 8 * time.Second
	rounds := 2
	if n, err := strconv.Atoi(os.Getenv("CUCKOOGUARD_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	sum := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s
	}
	for _, clients := range []int{16, 64} {
		var users, plain, notified []float64
		var ws, fs float64
		for range rounds { // alternate
			w, f := cpuDuring(t, db, func() { users = append(users, pgbench(t, dsn, "users", clients, d)) })
			ws, fs = ws+w, fs+f
			plain = append(plain, pgbench(t, dsn, "plain", clients, d))
			notified = append(notified, pgbench(t, dsn, "notified", clients, d))
		}
		t.Logf("%d writers, tps per %v run: logical-followed %.0f, unfollowed %.0f, NOTIFY-followed %.0f: logical %.2fx, NOTIFY %.2fx of unfollowed; while the logical runs ran, the walsenders used %.2f cores, this process (4 replicas) %.2f",
			clients, d, users, plain, notified, sum(users)/sum(plain), sum(notified)/sum(plain),
			ws/(float64(rounds)*d.Seconds()), fs/(float64(rounds)*d.Seconds()))
	}
	// The cost of a follower at a fixed write rate: what the README sizes.
	const rate = 2000
	var tps float64
	w, f := cpuDuring(t, db, func() { tps = pgbench(t, dsn, "users", 16, 10*time.Second, "-R", strconv.Itoa(rate)) })
	t.Logf("at a fixed %d inserts/s (%.0f done): the 2 logical followers' walsenders used %.1f%% of a core each, and this process (4 replicas, 2 of them idle NOTIFY ones) %.1f%%",
		rate, tps, 100*w/2/10, 100*f/10)
}

// TestRestartTenMillion is the restart goal of the logical-decoding
// issue: a replica of a 10M-row table, restarted with its snapshot file,
// is following again (its guard answers on its own) while writes go on;
// next to it, a cold start that reads the table.
//
//	CUCKOOGUARD_MEASURE=1 go test -run TestRestartTenMillion -v -timeout 30m .
func TestRestartTenMillion(t *testing.T) {
	measuring(t)
	ctx := context.Background()
	const rows = 10_000_000
	start := time.Now()
	dsn := setupUsers(t, rows)
	t.Logf("seeded %d rows in %v", rows, time.Since(start).Round(time.Second))
	file := filepath.Join(t.TempDir(), "users.guard")
	// A writer, another process, all along.
	wctx, stopWriter := context.WithCancel(ctx)
	var written atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		w, err := pgx.Connect(wctx, dsn)
		if err != nil {
			return
		}
		defer w.Close(context.Background())
		for id := int64(rows + 1); wctx.Err() == nil; id++ {
			if _, err := w.Exec(wctx, `INSERT INTO users VALUES ($1, 'w')`, id); err == nil {
				written.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() { stopWriter(); <-done }()

	cold := time.Now()
	a := startReplicaVia(t, dsn, dsn, "A", WithSnapshotFile(file))
	coldTook := time.Since(cold)
	t.Logf("cold start: following after %v (%+v)", coldTook, a.follower.Stats())
	time.Sleep(2 * time.Second)
	a.halt()
	info, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot file: %d bytes", info.Size())
	time.Sleep(2 * time.Second) // writes while it is down
	warm := time.Now()
	b := startReplicaVia(t, dsn, dsn, "A", WithSnapshotFile(file))
	warmTook := time.Since(warm)
	st := b.follower.Stats()
	t.Logf("restart with the snapshot file: following after %v, cold start %v; %+v", warmTook, coldTook, st)
	if st.SnapshotStart != 1 || st.Resyncs != 0 {
		t.Fatalf("the restart read the table: %+v", st)
	}
	stopWriter()
	<-done
	scan := time.Now()
	agrees(t, b, dsn)
	t.Logf("guard agrees with the table (%d rows written meanwhile); scan took %v", written.Load(), time.Since(scan))
}

// TestFollowerApplyCost measures the CPU one logical follower spends per
// change it applies, at a fixed write rate (pgbench -R), with this
// process's CPU profile if -cpuprofile is given.
//
//	CUCKOOGUARD_MEASURE=1 go test -run TestFollowerApplyCost -v -cpuprofile cpu.out .
func TestFollowerApplyCost(t *testing.T) {
	measuring(t)
	if _, err := exec.LookPath("pgbench"); err != nil {
		t.Skip("pgbench not found")
	}
	dsn := setupUsers(t, 1000)
	db := connect(t, dsn)
	r := startReplica(t, dsn, "A")
	const rate, secs = 4000, 10
	before := r.follower.Stats().Applied
	var tps float64
	w, f := cpuDuring(t, db, func() { tps = pgbench(t, dsn, "users", 16, secs*time.Second, "-R", strconv.Itoa(rate)) })
	applied := r.follower.Stats().Applied - before
	t.Logf("%.0f inserts/s for %d s, %d applied: walsender %.1f%% of a core, follower process %.1f%% (%.1f µs of CPU per change applied)",
		tps, secs, applied, 100*w/secs, 100*f/secs, f*1e6/float64(max(applied, 1)))
}
