package mysql

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
)

// TestReadyFromSnapshotFile restarts a follower of a 200,000-row table
// from its snapshot file, while another client commits rows before and
// during the restart: the new process must not read the table, and once
// ready must hold every committed key. It is TestMeasureReadyTenMillion's
// check at a size the suite runs.
func TestReadyFromSnapshotFile(t *testing.T) {
	restartFromFile(t, 200_000, 1)
}

// TestMeasureReadyTenMillion measures, with CUCKOOGUARD_MEASURE=1, the
// issue's goal: the time a new process takes to be ready on a table of
// 10,000,000 rows (CUCKOOGUARD_ROWS to change it), from its snapshot
// file, with 0 reads of the table; three restarts, each after rows
// committed while no follower ran and with a writer committing all along.
//
//	CUCKOOGUARD_MEASURE=1 go test -run TestMeasureReadyTenMillion -v -timeout 30m .
func TestMeasureReadyTenMillion(t *testing.T) {
	if os.Getenv("CUCKOOGUARD_MEASURE") != "1" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure")
	}
	rows := 10_000_000
	if n, err := parseInt64(os.Getenv("CUCKOOGUARD_ROWS")); err == nil && n > 0 {
		rows = int(n)
	}
	runs := restartFromFile(t, rows, 3)
	ready := make([]time.Duration, len(runs))
	for i, r := range runs {
		ready[i] = r.ready
	}
	slices.Sort(ready)
	t.Logf("%d rows: ready from the snapshot file after min %v, median %v, max %v",
		rows, ready[0].Round(time.Millisecond), ready[len(ready)/2].Round(time.Millisecond), ready[len(ready)-1].Round(time.Millisecond))
}

// readyRun is what one start from the snapshot file took, from the call
// of NewFollower (a fresh Loader's guard made just before) to a ready
// Loader, and its parts, as the Follower's log tells them.
type readyRun struct {
	ready   time.Duration // to a ready Loader, following
	setup   time.Duration // to the file's read: connections, the server's and the table's checks
	read    time.Duration // the file read and checked: header, checksums, guard.Restore
	install time.Duration // the restored guard installed in the Loader
	proven  time.Duration // the stream started, and its first transaction proven the one the file ends with
	caught  time.Duration // the rest: the catch-up, and the marker's round trip
	applied int64         // changes applied by then
}

func (r readyRun) String() string {
	ms := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	return fmt.Sprintf("%v (setup %v, file read and checked %v, guard installed %v, stream started and position proven %v, %d changes caught up and the marker back %v)",
		ms(r.ready), ms(r.setup), ms(r.read), ms(r.install), ms(r.proven), r.applied, ms(r.caught))
}

// restartFromFile loads rows rows (ids 0 to rows-1) into a table, has a
// follower read it and save its guard, and then restarts a follower from
// the file restarts times, each in a fresh Loader, after rows committed
// while none ran and with a writer committing one row at a time all
// along. Each restart must read no row of the table, and, once ready,
// hold every key committed: it checks them all, in the guard itself and
// through the Loader.
func restartFromFile(t *testing.T, rows, restarts int) []readyRun {
	t.Helper()
	srv := testDSN(t)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	began := time.Now()
	loadSequence(t, c, table, rows)
	t.Logf("loaded %d rows in %v", rows, time.Since(began).Round(time.Millisecond))
	file := filepath.Join(t.TempDir(), "keys.guard")
	a := startNode(t, srv, table, "id", parseInt64, WithSnapshotFile(file))
	read := a.waitCurrent(t)
	a.halt(t)
	info, err := os.Stat(file)
	if err != nil {
		t.Fatalf("the first follower saved no snapshot file: %v", err)
	}
	t.Logf("the first follower read the table and followed after %v; its %d-byte snapshot file was saved at its exit", read.Round(time.Millisecond), info.Size())
	next := int64(rows) // the next id to commit
	var runs []readyRun
	for i := range restarts {
		// While no follower runs: single-row commits, and a transaction.
		for range 500 {
			exec(t, c, fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, next))
			next++
		}
		insertRange(t, c, table, int(next), int(next)+1500)
		next += 1500
		w := startCounting(t, srv, table, next)
		log := &logTimes{}
		start := time.Now()
		n := startNode(t, srv, table, "id", parseInt64, WithSnapshotFile(file), WithLogger(slog.New(log)))
		deadline := start.Add(60 * time.Second)
		for !n.loader.Ready() || n.follower.Stats().State != Following {
			if time.Now().After(deadline) {
				st := n.follower.Stats()
				t.Fatalf("restart %d: not ready after 60 s: state %v, last error %v", i, st.State, st.LastError)
			}
			time.Sleep(200 * time.Microsecond)
		}
		r := readyRun{ready: time.Since(start), applied: n.follower.Stats().Applied}
		// Rows committed after the restart was ready, as well.
		for w.committed() < 300 && time.Since(start) < 30*time.Second {
			time.Sleep(10 * time.Millisecond)
		}
		next = w.halt(t)
		r.breakdown(t, log, start)
		t.Logf("restart %d: ready after %v", i, r)
		checkAll(t, n, next)
		n.halt(t) // saves its guard: the next restart starts from it
		runs = append(runs, r)
	}
	return runs
}

// breakdown fills r's parts from the Follower's log.
func (r *readyRun) breakdown(t *testing.T, log *logTimes, start time.Time) {
	t.Helper()
	restored, ok := log.find("cuckooguard: follower starts from its snapshot file")
	if !ok {
		t.Fatalf("the follower did not start from its snapshot file: %v", log.messages())
	}
	resumed, ok := log.find("cuckooguard: follower resumed without reading the table")
	if !ok {
		t.Fatalf("the follower did not resume: %v", log.messages())
	}
	r.read, r.install = restored.durations["read"], restored.durations["took"]-restored.durations["read"]
	r.setup = restored.at.Sub(start) - restored.durations["took"]
	r.proven = resumed.at.Sub(restored.at)
	r.caught = r.ready - resumed.at.Sub(start)
}

// checkAll checks, once n is current, that the table holds exactly the
// ids below next (only inserts ran), that n read none of its rows and
// started from the snapshot file, and that every one of those ids is in
// the guard and none reads absent through the Loader, ready before and
// after the check with no session ended between; and that ids never
// committed are absent from the guard (it does not hold everything).
func checkAll(t *testing.T, n *node[int64], next int64) {
	t.Helper()
	r, err := n.conn.Execute("SELECT COUNT(*), COALESCE(MIN(id), -1), COALESCE(MAX(id), -1) FROM `" + n.table + "`")
	if err != nil {
		t.Fatal(err)
	}
	count, _ := r.GetInt(0, 0)
	lo, _ := r.GetInt(0, 1)
	hi, _ := r.GetInt(0, 2)
	if count != next || lo != 0 || hi != next-1 {
		t.Fatalf("the table holds %d rows, ids %d to %d; want %d, 0 to %d", count, lo, hi, next, next-1)
	}
	n.waitCurrent(t)
	l, g := n.loader, n.loader.Guard()
	st := n.follower.Stats()
	if !l.Ready() {
		t.Fatal("the Loader is not ready after waitCurrent")
	}
	missing, wrong := 0, 0
	for id := range next {
		if !g.ContainsHash(l.Hash(id)) {
			missing++
		}
		if !l.MayContain(id) {
			wrong++
		}
	}
	absent, rejected := int64(100_000), 0
	for id := next; id < next+absent; id++ {
		// The guard's own answer: the Loader's passes through while its
		// lease lapses between two heartbeats (under -race, say).
		if !g.ContainsHash(l.Hash(id)) {
			rejected++
		}
	}
	after := n.follower.Stats()
	t.Logf("%d committed ids checked: %d not in the guard, %d wrong 404s; %d of %d never committed rejected; %d reads, %d restores, %d resumes, %d session failures (%v)",
		next, missing, wrong, rejected, absent, after.FullReads, after.Restores, after.Resumes, after.Failures, after.LastError)
	switch {
	case missing != 0 || wrong != 0:
		t.Fatalf("%d committed ids not in the guard, %d wrong 404s; want 0, 0", missing, wrong)
	case !l.Ready() || after.Failures != st.Failures:
		t.Fatalf("the Loader stopped following during the check (ready %v, failures %d then %d): its answers were not all the guard's", l.Ready(), st.Failures, after.Failures)
	case after.FullReads != 0 || after.Restores != 1 || after.Resumes != 1:
		t.Fatalf("%d reads, %d restores, %d resumes; want 0, 1, 1", after.FullReads, after.Restores, after.Resumes)
	case int64(rejected) < absent*9/10:
		t.Fatalf("%d of %d never committed ids rejected, want nearly all", rejected, absent)
	}
}

// loadSequence inserts the ids 0 to rows-1 into table, from MariaDB's
// Sequence engine, a million a transaction.
func loadSequence(t *testing.T, c *client.Conn, table string, rows int) {
	t.Helper()
	const chunk = 1_000_000
	for lo := 0; lo < rows; lo += chunk {
		exec(t, c, fmt.Sprintf("INSERT INTO `%s` (id) SELECT seq FROM seq_%d_to_%d", table, lo, min(lo+chunk, rows)-1))
	}
}

// counting is a writer that commits the ids from a start, one row a
// transaction, until halted.
type counting struct {
	from  int64
	next  atomic.Int64 // the next id to commit
	stop  chan struct{}
	done  chan error
	close sync.Once
}

// startCounting starts a counting writer on a connection of its own.
func startCounting(t *testing.T, srv server, table string, from int64) *counting {
	t.Helper()
	c, err := client.ConnectWithTimeout(srv.addr(), srv.user, srv.password, srv.db, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := &counting{from: from, stop: make(chan struct{}), done: make(chan error, 1)}
	w.next.Store(from)
	go func() {
		defer c.Close()
		for {
			select {
			case <-w.stop:
				w.done <- nil
				return
			default:
			}
			id := w.next.Load()
			if _, err := c.Execute(fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, id)); err != nil {
				w.done <- fmt.Errorf("insert %d: %w", id, err)
				return
			}
			w.next.Store(id + 1)
		}
	}()
	t.Cleanup(func() { w.halt(t) })
	return w
}

// committed returns how many rows w has committed.
func (w *counting) committed() int64 { return w.next.Load() - w.from }

// halt stops w and returns the next id it would have committed: every id
// below it is committed.
func (w *counting) halt(t *testing.T) int64 {
	t.Helper()
	w.close.Do(func() {
		close(w.stop)
		if err := <-w.done; err != nil {
			t.Errorf("the writer: %v", err)
		}
	})
	return w.next.Load()
}

// logTimes is a slog.Handler that keeps each record's time, message and
// durations, for a test to read the Follower's progress from.
type logTimes struct {
	mu      sync.Mutex // protects records
	records []logRecord
}

type logRecord struct {
	at        time.Time
	msg       string
	durations map[string]time.Duration
}

func (h *logTimes) Enabled(context.Context, slog.Level) bool { return true }

func (h *logTimes) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{at: r.Time, msg: r.Message, durations: map[string]time.Duration{}}
	r.Attrs(func(a slog.Attr) bool {
		if a.Value.Kind() == slog.KindDuration {
			rec.durations[a.Key] = a.Value.Duration()
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, rec)
	return nil
}

func (h *logTimes) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logTimes) WithGroup(string) slog.Handler      { return h }

// find returns the first record with message msg.
func (h *logTimes) find(msg string) (logRecord, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.msg == msg {
			return r, true
		}
	}
	return logRecord{}, false
}

// messages returns the messages logged, in order.
func (h *logTimes) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		out = append(out, r.msg)
	}
	return out
}
