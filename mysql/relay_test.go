package mysql

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
)

func TestRelayPositions(t *testing.T) {
	for _, c := range []struct {
		file string
		off  uint32
		want uint64
	}{
		{"binlog.000012", 4711, 12<<32 | 4711},
		{"binlog.000001", 4, 1<<32 | 4},
		{"mysql-bin.999999", 1 << 31, 999999<<32 | 1<<31},
	} {
		got, err := encodePos(c.file, c.off)
		if err != nil || got != c.want {
			t.Errorf("encodePos(%q, %d) = %d, %v; want %d", c.file, c.off, got, err, c.want)
		}
		if f, off := decodePos(got, c.file); f != c.file || off != c.off {
			t.Errorf("decodePos(%d) = %s:%d, want %s:%d", got, f, off, c.file, c.off)
		}
	}
	a, _ := encodePos("binlog.000012", 1<<32-1)
	b, _ := encodePos("binlog.000013", 4)
	if a >= b {
		t.Errorf("the end of binlog.000012 (%d) is not before binlog.000013:4 (%d)", a, b)
	}
	for _, bad := range []string{"binlog", "binlog.x1", "binlog.99999999999"} {
		if _, err := encodePos(bad, 4); err == nil {
			t.Errorf("encodePos(%q) = nil error, want one", bad)
		}
	}
}

func TestRelayOrigin(t *testing.T) {
	o := originOf(1, 0, "cuckooguard")
	if err := follow.CheckToken(o.Token); err != nil || !strings.HasPrefix(o.Token, "m1_0_") || len(o.Token) != len("m1_0_")+8 {
		t.Errorf("originOf(1, 0, cuckooguard) = %q (%v), want m1_0_ and 8 hex digits", o.Token, err)
	}
	if err := follow.CheckToken(originOf(1<<32-1, 1<<32-1, "db").Token); err != nil {
		t.Errorf("the largest ids: %v", err)
	}
	for _, other := range []follow.Origin{originOf(2, 0, "cuckooguard"), originOf(1, 1, "cuckooguard"), originOf(1, 0, "other")} {
		if other.Same(o) {
			t.Errorf("%s and %s are the same origin", other, o)
		}
	}
	if !originOf(1, 0, "cuckooguard").Same(o) {
		t.Error("one database's origins differ")
	}
}

// fullMetadata sets binlog_row_metadata=FULL on the test's server, which
// a relay needs (the server's own setting is restored at the test's end).
func fullMetadata(t *testing.T, srv server) {
	t.Helper()
	c := connect(t, srv)
	r, err := c.Execute("SELECT @@GLOBAL.binlog_row_metadata")
	if err != nil {
		t.Fatal(err)
	}
	was, _ := r.GetString(0, 0)
	exec(t, c, "SET GLOBAL binlog_row_metadata = 'FULL'")
	t.Cleanup(func() {
		if was != "FULL" {
			exec(t, connect(t, srv), "SET GLOBAL binlog_row_metadata = '"+was+"'")
		}
	})
}

// recorder is a follow.Handler that confirms everything and keeps what
// it got.
type recorder struct {
	src     follow.Source
	mu      sync.Mutex
	starts  []follow.Start
	commits []follow.Commit
}

func (r *recorder) Start(_ context.Context, s follow.Start) error {
	r.mu.Lock()
	r.starts = append(r.starts, s)
	r.mu.Unlock()
	r.src.Confirm(s.Pos)
	return nil
}

func (r *recorder) Commit(_ context.Context, c *follow.Commit) error {
	cp := *c
	cp.Tables = slices.Clone(c.Tables)
	r.mu.Lock()
	if n := len(r.commits); n > 0 && r.commits[n-1].Pos >= c.Pos {
		// Streamed again by a later session (after DDL, from the saved
		// place): the relay publishes a position once.
		r.mu.Unlock()
		r.src.Confirm(c.Pos)
		return nil
	}
	r.commits = append(r.commits, cp)
	r.mu.Unlock()
	r.src.Confirm(c.Pos)
	return nil
}

// wait waits until ok holds of the commits got.
func (r *recorder) wait(t *testing.T, what string, ok func(cs []follow.Commit) bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.mu.Lock()
		done := ok(r.commits)
		r.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never got %s", what)
		}
	}
}

// relayedDB returns srv's database as the relay reaches it (Relayed),
// whose relay name is torn down when the test ends.
func relayedDB(t *testing.T, srv server, name string) follow.Database {
	t.Helper()
	db, err := Relayed(dsnOf(srv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Teardown(context.Background(), name, nil) })
	return db
}

// TestRelaySource runs a relay's Source against the server: inserts,
// deletes and key updates come as canonical keys, a tag and a control
// row with their transaction, TRUNCATE as an incomplete table, and a
// restarted Source resumes from its saved place without a reset.
func TestRelaySource(t *testing.T) {
	srv := testDSN(t)
	fullMetadata(t, srv)
	table, c := newTable(t, srv, "id VARCHAR(64) NOT NULL PRIMARY KEY, n INT", "")
	exec(t, c, "INSERT INTO `"+table+"` VALUES ('seed', 0)")
	name := "test " + table
	db := relayedDB(t, srv, name)
	run := func() (*recorder, func()) {
		return runSourceWith(t, db, name, []follow.Table{{Table: table, Key: "id"}}, time.Second, func(src follow.Source) *recorder { return &recorder{src: src} })
	}
	r, stop := run()
	if len(r.starts) != 1 || !r.starts[0].Reset || r.starts[0].Tables[0] != srv.db+"."+table || r.starts[0].Origin.IsZero() {
		t.Fatalf("first start %+v, want a reset of %s.%s", r.starts, srv.db, table)
	}
	// Case and accents are one key under utf8mb4_general_ci: the form is
	// the lowest character of each weight.
	exec(t, c, "INSERT INTO `"+table+"` VALUES ('Alice', 1), ('bob', 2)", "DELETE FROM `"+table+"` WHERE id = 'seed'",
		"UPDATE `"+table+"` SET id = 'carol' WHERE id = 'bob'", "UPDATE `"+table+"` SET n = 5 WHERE id = 'carol'")
	has := func(list []string, k string) bool { return slices.Contains(list, k) }
	r.wait(t, "the writes", func(cs []follow.Commit) bool {
		var creates, deletes []string
		for _, c := range cs {
			creates = append(creates, c.Tables[0].Creates...)
			deletes = append(deletes, c.Tables[0].Deletes...)
		}
		return len(cs) >= 3 && has(creates, "ALICE") && has(creates, "BOB") && has(deletes, "SEED") && has(deletes, "BOB") && has(creates, "CAROL")
	})
	// A tag and a control row, in one transaction with an insert.
	q, args := db.TagStatement([]byte("tag-content"))
	exec(t, c, "BEGIN", "INSERT INTO `"+table+"` VALUES ('dave', 1)")
	if _, err := c.Execute(q, args...); err != nil {
		t.Fatal(err)
	}
	exec(t, c, "COMMIT")
	sess, err := db.Connect(context.Background(), table, "id")
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Emit(context.Background(), "route-x", "payload-y"); err != nil {
		t.Fatal(err)
	}
	r.wait(t, "the tag and the control row", func(cs []follow.Commit) bool {
		tag, ctl := false, false
		for _, c := range cs {
			tag = tag || len(c.Tags) == 1 && string(c.Tags[0]) == "tag-content" && has(c.Tables[0].Creates, "DAVE")
			for _, k := range c.Controls {
				ctl = ctl || k.Route == "route-x" && k.Payload == "payload-y" && k.Table == r.starts[0].Identities[0]
			}
		}
		return tag && ctl
	})
	n, rows := 0, 0
	seen, rows64, err := sess.Read(context.Background(), func(string) error { n++; return nil })
	rows = int(rows64)
	if err != nil || n != 3 || rows != 3 {
		t.Fatalf("Read = %d keys (%d), %v; want 3", n, rows, err)
	}
	r.mu.Lock()
	last := r.commits[len(r.commits)-1].Pos
	r.mu.Unlock()
	if !seen.Saw(last, 0) {
		t.Errorf("a read after commit %d did not see it", last)
	}
	sess.Close()
	exec(t, c, "TRUNCATE TABLE `"+table+"`")
	r.wait(t, "TRUNCATE as an incomplete table", func(cs []follow.Commit) bool {
		return len(cs) > 0 && cs[len(cs)-1].Tables[0].Incomplete
	})
	// Once the place is saved past the TRUNCATE, start again: no reset.
	r.mu.Lock()
	last = r.commits[len(r.commits)-1].Pos
	r.mu.Unlock()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		res, err := c.Execute("SELECT file, pos FROM `"+relayTable+"` WHERE name = ?", name)
		if err != nil {
			t.Fatal(err)
		}
		if res.RowNumber() == 1 {
			file, _ := res.GetString(0, 0)
			off, _ := res.GetUint(0, 1)
			if p, err := encodePos(file, uint32(off)); err == nil && p >= last {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the Source never saved its place past the TRUNCATE")
		}
	}
	stop()
	exec(t, c, "INSERT INTO `"+table+"` VALUES ('erin', 1)")
	r2, _ := run()
	if r2.starts[0].Reset {
		t.Errorf("a restarted Source reset; want it to resume from its saved place")
	}
	r2.wait(t, "the insert made while the Source was stopped", func(cs []follow.Commit) bool {
		for _, c := range cs {
			if has(c.Tables[0].Creates, "ERIN") {
				return true
			}
		}
		return false
	})
	if st := r2.src.Stats(); st.VisibilityWaits == 0 {
		t.Errorf("VisibilityWaits = 0, want the commits held until a probe returned")
	}
}

// TestRelaySourceIdentity swaps the relayed table by a rename that the
// binlog does not carry (sql_log_bin=0) while a writer commits, so that
// probes, which carry no identities, are written all along: they end
// nothing, and the first heartbeat after the swap ends the session, whose
// successor starts with the new table's identity.
func TestRelaySourceIdentity(t *testing.T) {
	srv := testDSN(t)
	fullMetadata(t, srv)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	name := "test " + table
	db := relayedDB(t, srv, name)
	src, err := db.Source(name, []follow.Table{{Table: table, Key: "id"}}, follow.SourceConfig{Heartbeat: 200 * time.Millisecond, Deadline: 2 * time.Second,
		Backoff: 20 * time.Millisecond, MaxBackoff: time.Second, Logger: slog.New(slog.NewTextHandler(testLog{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{src: src}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, r) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
	})
	for deadline := time.Now().Add(20 * time.Second); !src.Stats().Streaming; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never streamed: %+v", src.Stats())
		}
	}
	w := startWriters(t, srv, table, 1, 1<<20)
	time.Sleep(time.Second) // five heartbeats, and a probe for each commit held
	if st := src.Stats(); st.Failures != 0 || st.Sessions != 1 || st.VisibilityWaits == 0 || st.Commits == 0 {
		t.Fatalf("after a second of writes: %+v; want one session, no failure, commits held until a probe returned", st)
	}
	exec(t, c, "SET SESSION sql_log_bin = 0", "CREATE TABLE `"+table+"_new` LIKE `"+table+"`",
		"RENAME TABLE `"+table+"` TO `"+table+"_old`, `"+table+"_new` TO `"+table+"`", "SET SESSION sql_log_bin = 1")
	for deadline := time.Now().Add(20 * time.Second); src.Stats().Sessions < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the session did not end after an unlogged rename swap: %+v", src.Stats())
		}
	}
	w.halt()
	st := src.Stats()
	if !errors.Is(st.LastError, errTableChanged) {
		t.Errorf("the session ended with %v, want errTableChanged", st.LastError)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.starts) < 2 || r.starts[1].Identities[0] == r.starts[0].Identities[0] {
		t.Errorf("starts %+v; want a second one with the new table's identity", r.starts)
	}
}

// testLog writes a logger's lines to the test's log.
type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// runSourceWith runs a Source of relay name for tables (heartbeat 50 ms,
// backoff 20 ms to maxBackoff) with the handler that handler makes for it,
// until the test ends (or stop), and waits until it streams.
func runSourceWith[H follow.Handler](t *testing.T, db follow.Database, name string, tables []follow.Table, maxBackoff time.Duration, handler func(follow.Source) H) (H, func()) {
	t.Helper()
	src, err := db.Source(name, tables, follow.SourceConfig{Heartbeat: 50 * time.Millisecond, Deadline: time.Second,
		Backoff: 20 * time.Millisecond, MaxBackoff: maxBackoff, Logger: slog.New(slog.NewTextHandler(testLog{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := handler(src)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, h) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v, want context.Canceled", err)
			}
		})
	}
	t.Cleanup(stop)
	for deadline := time.Now().Add(20 * time.Second); !src.Stats().Streaming; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never streamed: %+v", src.Stats())
		}
	}
	return h, stop
}
