package mysql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"github.com/cuckooguard/cuckooguard/follow"
)

// Adversarial review of the relay's Source (issue 52): each test is a
// way for a relayed follower to answer "absent" for a committed key, or
// for the Source to continue a history it cannot prove. A test that
// fails here is a finding, not a flake.

// reviewSource runs a Source of relay name for tables with a recorder
// until the test ends (or stop), and waits until it streams.
func reviewSource(t *testing.T, db follow.Database, name string, tables []follow.Table) (*recorder, func()) {
	t.Helper()
	return runSourceWith(t, db, name, tables, 200*time.Millisecond, func(src follow.Source) *recorder { return &recorder{src: src} })
}

// marked waits for the commit that creates marker in table i, and
// returns the commits up to it.
func (r *recorder) marked(t *testing.T, i int, marker string) []follow.Commit {
	t.Helper()
	var got []follow.Commit
	r.wait(t, "the marker "+marker, func(cs []follow.Commit) bool {
		for j, c := range cs {
			if slices.Contains(c.Tables[i].Creates, marker) {
				got = slices.Clone(cs[:j+1])
				return true
			}
		}
		return false
	})
	return got
}

// accounted reports whether the commits carry key as created in table i,
// or make the table's followers read it again.
func accounted(cs []follow.Commit, i int, key string) bool {
	for _, c := range cs {
		if slices.Contains(c.Tables[i].Creates, key) || c.Tables[i].Incomplete || c.Tables[i].Truncated {
			return true
		}
	}
	return false
}

// TestReviewRelayMinimalImageSession: the Source checks the GLOBAL
// binlog_row_image, but any session may SET SESSION binlog_row_image =
// 'MINIMAL'. An UPDATE of a non-key column then logs the before image
// with the primary key only and the after image with the changed column
// only: go-mysql gives the missing key column as nil, which rows() reads
// as "no key" (NULL), and an update whose before key is there and whose
// after key is not is a delete. The key is still in the table: a wrong
// "absent" at every relayed follower until its next read.
func TestReviewRelayMinimalImageSession(t *testing.T) {
	srv := testDSN(t)
	fullMetadata(t, srv)
	table, c := newTable(t, srv, "id VARCHAR(64) NOT NULL PRIMARY KEY, n INT", "")
	exec(t, c, "INSERT INTO `"+table+"` VALUES ('keep', 0)")
	name := "review " + table
	db := relayedDB(t, srv, name)
	r, _ := reviewSource(t, db, name, []follow.Table{{Table: table, Key: "id"}})
	w := connect(t, srv)
	exec(t, w, "SET SESSION binlog_row_image = 'MINIMAL'",
		"UPDATE `"+table+"` SET n = 1 WHERE id = 'keep'",
		"SET SESSION binlog_row_image = 'FULL'",
		"INSERT INTO `"+table+"` VALUES ('marker', 0)")
	for _, c := range r.marked(t, 0, "MARKER") {
		if ch := c.Tables[0]; slices.Contains(ch.Deletes, "KEEP") && !slices.Contains(ch.Creates, "KEEP") && !ch.Incomplete {
			t.Errorf("commit %d deletes KEEP (an UPDATE of n under a session's binlog_row_image=MINIMAL); the row is still there: a wrong 404", c.Pos)
		}
	}
}

// TestReviewRelayStatementUnnamed: a session in binlog_format=STATEMENT
// (any session with the privilege may SET it; the Source checks the
// global value) writes the table through a statement whose text does not
// name it: through a view, or through a trigger of another table. The
// Source finds statement-format writes by the table's name in the text
// (nameIn), so these pass unseen: the key is in the table, and in no
// commit, and the followers never read the table again.
func TestReviewRelayStatementUnnamed(t *testing.T) {
	srv := testDSN(t)
	fullMetadata(t, srv)
	table, c := newTable(t, srv, "id VARCHAR(64) NOT NULL PRIMARY KEY", "")
	view, src := "v_"+table, "s_"+table
	exec(t, c, "CREATE OR REPLACE VIEW `"+view+"` AS SELECT id FROM `"+table+"`",
		"CREATE TABLE IF NOT EXISTS `"+src+"` (id VARCHAR(64) NOT NULL PRIMARY KEY) ENGINE=InnoDB",
		"CREATE TRIGGER IF NOT EXISTS `tr_"+table+"` AFTER INSERT ON `"+src+"` FOR EACH ROW INSERT INTO `"+table+"` VALUES (NEW.id)")
	t.Cleanup(func() {
		exec(t, connect(t, srv), "DROP VIEW IF EXISTS `"+view+"`", "DROP TABLE IF EXISTS `"+src+"`")
	})
	name := "review " + table
	db := relayedDB(t, srv, name)
	r, _ := reviewSource(t, db, name, []follow.Table{{Table: table, Key: "id"}})
	for i, tc := range []struct{ key, stmt string }{
		{"viaview", "INSERT INTO `" + view + "` VALUES ('viaview')"},
		{"viatrigger", "INSERT INTO `" + src + "` VALUES ('viatrigger')"},
	} {
		r.mu.Lock()
		from := len(r.commits)
		r.mu.Unlock()
		w := connect(t, srv)
		exec(t, w, "SET SESSION binlog_format = 'STATEMENT'", tc.stmt, "SET SESSION binlog_format = 'ROW'",
			fmt.Sprintf("INSERT INTO `%s` VALUES ('marker%d')", table, i))
		cs := r.marked(t, 0, fmt.Sprintf("MARKER%d", i))
		if !accounted(cs[from:], 0, strings.ToUpper(tc.key)) {
			t.Errorf("%s: a statement-format write of %q is in the table and in no commit, and no commit makes the followers read the table: a wrong 404", tc.stmt, tc.key)
		}
	}
}

// savedAt waits until relay name's saved place is at or past pos, and
// returns it.
func savedAt(t *testing.T, c *client.Conn, name string, pos uint64) (string, int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		res, err := c.Execute("SELECT file, pos FROM `"+relayTable+"` WHERE name = ?", name)
		if err != nil {
			t.Fatal(err)
		}
		if res.RowNumber() == 1 {
			file, _ := res.GetString(0, 0)
			off, _ := res.GetInt(0, 1)
			if p, err := encodePos(file, uint32(off)); err == nil && p >= pos {
				return file, off
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the Source never saved its place")
		}
	}
}

// padTo commits one-row transactions to table (id BIGINT, pad
// VARCHAR(4000)) from id on until the binlog ends exactly at end of file,
// and returns the next id.
func padTo(t *testing.T, c *client.Conn, table, file string, end int64, id int) int {
	t.Helper()
	row := func(pad int) int64 {
		t.Helper()
		before := masterAt(t, c)
		exec(t, c, fmt.Sprintf("INSERT INTO `%s` (id, pad) VALUES (%d, REPEAT('x', %d))", table, id, pad))
		id++
		after := masterAt(t, c)
		if after.file != file {
			t.Fatalf("the binlog is in %s, want %s", after.file, file)
		}
		return after.pos - before.pos
	}
	base := row(1000) - 1000
	for {
		rem := end - masterAt(t, c).pos
		switch {
		case rem == 0:
			return id
		case rem-base >= 1000 && rem-base <= 4000:
			row(int(rem - base))
		case rem-base > 4000:
			row(int(min(4000, rem-2*base-1000)))
		default:
			t.Fatalf("the binlog is %d bytes short of %d, less than a transaction of %d: the scenario cannot be made", rem, end, base+1000)
		}
	}
}

// TestReviewRelayResumeOtherHistory: the relay's resume proof is the
// saved place's server_id, its file still listed at least that long, and
// gtid_binlog_pos not behind the saved GTID: unlike the Follower's
// resume (resume.go), it never checks that the transaction at the place
// is the one it passed on. After RESET MASTER (or a server replaced by a
// copy with the same server_id) and enough writes, a history with a
// transaction boundary at the saved offset passes every check: the Source
// starts with Reset=false and streams on from the middle of another
// history. A key committed in the new history before the saved offset is
// in no commit; fanout continues the epoch, and the followers never read
// the table. Unaligned ("written past"), the stream starts mid-event:
// the Source retries the same place for ever (never resets).
//
// It runs RESET MASTER: only against a server of the test's own.
func TestReviewRelayResumeOtherHistory(t *testing.T) {
	srv := testDSN(t)
	fullMetadata(t, srv)
	for _, aligned := range []bool{true, false} {
		t.Run(fmt.Sprintf("aligned=%v", aligned), func(t *testing.T) {
			table, c := newTable(t, srv, "id VARCHAR(64) NOT NULL PRIMARY KEY", "")
			pad := "p_" + table
			exec(t, c, "CREATE TABLE IF NOT EXISTS `"+pad+"` (id BIGINT NOT NULL PRIMARY KEY, pad VARCHAR(4000) CHARACTER SET ascii NOT NULL DEFAULT '') ENGINE=InnoDB")
			t.Cleanup(func() { exec(t, connect(t, srv), "DROP TABLE IF EXISTS `"+pad+"`") })
			name := "review " + table
			db := relayedDB(t, srv, name)
			exec(t, c, "RESET MASTER") // the saved place in the first file, which the next reset makes again
			r, stop := reviewSource(t, db, name, []follow.Table{{Table: table, Key: "id"}})
			for i := range 20 {
				exec(t, c, fmt.Sprintf("INSERT INTO `%s` VALUES ('old%d')", table, i))
			}
			last := r.marked(t, 0, "OLD19")
			file, off := savedAt(t, c, name, last[len(last)-1].Pos)
			stop()
			at := masterAt(t, c)
			t.Logf("saved place %s:%d; the binlog was at %s:%d, GTID seq %d", file, off, at.file, at.pos, at.seq)

			exec(t, c, "RESET MASTER")
			exec(t, c, "INSERT INTO `"+table+"` VALUES ('lost')") // before the saved offset, in the new history
			id := 1
			if aligned {
				id = padTo(t, c, pad, file, off, id)
			} else {
				for masterAt(t, c).pos <= off+4096 {
					exec(t, c, fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", pad, id))
					id++
				}
			}
			for masterAt(t, c).seq <= at.seq {
				exec(t, c, fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", pad, id))
				id++
			}
			exec(t, c, "INSERT INTO `"+table+"` VALUES ('after')")

			r2, _ := reviewSource(t, db, name, []follow.Table{{Table: table, Key: "id"}})
			r2.mu.Lock()
			start := r2.starts[0]
			r2.mu.Unlock()
			if start.Reset {
				return // what it must do: the followers read the table
			}
			t.Errorf("after RESET MASTER the Source resumed at %s:%d (Start.Pos %d) without a reset: another history, proven by nothing", file, off, start.Pos)
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				r2.mu.Lock()
				n, st := len(r2.starts), r2.src.Stats()
				got := accounted(r2.commits, 0, "LOST")
				reset := r2.starts[n-1].Reset
				r2.mu.Unlock()
				if got || reset {
					return
				}
				if time.Now().After(deadline) && !aligned {
					t.Errorf("the Source retries the saved place for ever and never resets (starts %d, sessions %d, failures %d, last error %v): the relay is down until someone deletes its row", n, st.Sessions, st.Failures, st.LastError)
					return
				}
				if time.Now().After(deadline) {
					t.Errorf("LOST, committed in the new history, is in no commit and no reset came (starts %d, sessions %d, failures %d, last error %v): a wrong 404", n, st.Sessions, st.Failures, st.LastError)
					return
				}
			}
		})
	}
}

// rawRecorder is a follow.Handler that keeps every start and commit as
// given (recorder drops a position streamed again), and confirms each.
type rawRecorder struct {
	src     follow.Source
	mu      sync.Mutex
	starts  []follow.Start
	commits [][]follow.Commit // by session
}

func (r *rawRecorder) Start(_ context.Context, s follow.Start) error {
	r.mu.Lock()
	r.starts = append(r.starts, s)
	r.commits = append(r.commits, nil)
	r.mu.Unlock()
	r.src.Confirm(s.Pos)
	return nil
}

func (r *rawRecorder) Commit(_ context.Context, c *follow.Commit) error {
	cp := *c
	cp.Tables = make([]follow.Changes, len(c.Tables))
	for i, ch := range c.Tables {
		cp.Tables[i] = follow.Changes{Creates: slices.Clone(ch.Creates), Deletes: slices.Clone(ch.Deletes), Truncated: ch.Truncated, Incomplete: ch.Incomplete}
	}
	r.mu.Lock()
	r.commits[len(r.commits)-1] = append(r.commits[len(r.commits)-1], cp)
	r.mu.Unlock()
	r.src.Confirm(c.Pos)
	return nil
}

func (r *rawRecorder) has(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.commits {
		for _, c := range s {
			if slices.Contains(c.Tables[0].Creates, key) {
				return true
			}
		}
	}
	return false
}

// runRaw runs a Source of relay name with a rawRecorder until stop.
func runRaw(t *testing.T, db follow.Database, name string, tables []follow.Table) (*rawRecorder, func()) {
	t.Helper()
	return runSourceWith(t, db, name, tables, 200*time.Millisecond, func(src follow.Source) *rawRecorder { return &rawRecorder{src: src} })
}

// TestReviewRelayPositionsAndSeen writes one-key transactions (some
// across FLUSH BINARY LOGS) while relayed sessions read the table, and
// restarts the Source in the middle: within a session every Commit.Pos
// is past Start.Pos and strictly increasing; a transaction streamed by
// two sessions has one position and one content; and each read saw
// exactly the commits at or before its snapshot (Saw), whatever
// committed during it.
func TestReviewRelayPositionsAndSeen(t *testing.T) {
	srv := testDSN(t)
	fullMetadata(t, srv)
	table, _ := newTable(t, srv, "id VARCHAR(64) NOT NULL PRIMARY KEY", "")
	name := "review " + table
	db := relayedDB(t, srv, name)
	tables := []follow.Table{{Table: table, Key: "id"}}
	r1, stop1 := runRaw(t, db, name, tables)

	type read struct {
		seen follow.Seen
		keys map[string]bool
	}
	var reads []read
	var wg sync.WaitGroup
	writing := make(chan struct{})
	wg.Go(func() {
		sess, err := db.Connect(context.Background(), table, "id")
		if err != nil {
			t.Error(err)
			return
		}
		defer sess.Close()
		for {
			select {
			case <-writing:
				return
			default:
			}
			keys := map[string]bool{}
			seen, _, err := sess.Read(context.Background(), func(k string) error { keys[k] = true; return nil })
			if err != nil {
				t.Error(err)
				return
			}
			reads = append(reads, read{seen, keys})
		}
	})
	w := connect(t, srv)
	n := 0
	write := func(count int) {
		for range count {
			if n%7 == 3 {
				exec(t, w, "BEGIN", fmt.Sprintf("INSERT INTO `%s` VALUES ('k%d')", table, n), fmt.Sprintf("INSERT INTO `%s` VALUES ('k%d_b')", table, n), "COMMIT")
			} else {
				exec(t, w, fmt.Sprintf("INSERT INTO `%s` VALUES ('k%d')", table, n))
			}
			if n%50 == 25 {
				exec(t, w, "FLUSH BINARY LOGS")
			}
			n++
		}
	}
	write(300)
	for !r1.has(fmt.Sprintf("K%d", n-1)) {
		time.Sleep(10 * time.Millisecond)
	}
	stop1()
	write(300)
	r2, stop2 := runRaw(t, db, name, tables)
	for !r2.has(fmt.Sprintf("K%d", n-1)) {
		time.Sleep(10 * time.Millisecond)
	}
	close(writing)
	wg.Wait()
	stop2()

	byPos := map[uint64]follow.Commit{}
	var all []follow.Commit
	for _, r := range []*rawRecorder{r1, r2} {
		for i, st := range r.starts {
			prev := st.Pos
			for _, c := range r.commits[i] {
				if c.Pos <= prev {
					t.Errorf("session %d: commit at %d after %d (Start.Pos %d): not strictly increasing", i, c.Pos, prev, st.Pos)
				}
				prev = c.Pos
				if o, ok := byPos[c.Pos]; ok {
					if !slices.Equal(o.Tables[0].Creates, c.Tables[0].Creates) {
						t.Errorf("position %d streamed twice with other keys: %v, then %v", c.Pos, o.Tables[0].Creates, c.Tables[0].Creates)
					}
					continue
				}
				byPos[c.Pos] = c
				all = append(all, c)
			}
		}
	}
	if r2.starts[0].Reset {
		t.Errorf("the restarted Source reset")
	}
	created := 0
	for _, c := range all {
		created += len(c.Tables[0].Creates)
	}
	got := map[string]bool{}
	for _, c := range all {
		for _, k := range c.Tables[0].Creates {
			got[k] = true
		}
	}
	var missing []string
	for i := range n {
		for _, k := range []string{fmt.Sprintf("K%d", i), fmt.Sprintf("K%d_B", i)} {
			if !got[k] && (i%7 == 3 || !strings.HasSuffix(k, "_B")) {
				missing = append(missing, k)
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d keys committed are in no commit: %v", len(missing), created+len(missing), missing)
		for i, r := range []*rawRecorder{r1, r2} {
			for j, st := range r.starts {
				t.Logf("run %d session %d: start %d (reset %v), %d commits", i, j, st.Pos, st.Reset, len(r.commits[j]))
			}
		}
	}
	checked := 0
	for i, rd := range reads {
		for _, c := range all {
			saw := rd.seen.Saw(c.Pos, c.Xid)
			for _, k := range c.Tables[0].Creates {
				checked++
				if saw != rd.keys[k] {
					t.Errorf("read %d: Saw(%d) = %v, but the read has key %s: %v", i, c.Pos, saw, k, rd.keys[k])
				}
			}
		}
	}
	t.Logf("%d reads, %d commits, %d key checks", len(reads), len(all), checked)
	if len(reads) < 2 {
		t.Errorf("only %d reads during the writes", len(reads))
	}
}

// TestReviewRelayRows writes the table in the ways of issue 52's
// question 6 and applies the commits to a count per key, as a follower's
// guard does (creates, then deletes): every key the table holds at the
// end must count at least once, and a table of the same name in another
// schema must change nothing.
func TestReviewRelayRows(t *testing.T) {
	srv := testDSN(t)
	fullMetadata(t, srv)
	table, c := newTable(t, srv, "id VARCHAR(64) NOT NULL PRIMARY KEY, n INT NOT NULL DEFAULT 0, u INT NULL UNIQUE", "")
	other := "o_" + table
	exec(t, c, "CREATE TABLE IF NOT EXISTS `"+other+"` (id VARCHAR(64) NOT NULL PRIMARY KEY, v INT) ENGINE=InnoDB",
		"CREATE DATABASE IF NOT EXISTS cg_review_other",
		"CREATE TABLE IF NOT EXISTS cg_review_other.`"+table+"` (id VARCHAR(64) NOT NULL PRIMARY KEY, n INT NOT NULL DEFAULT 0, u INT NULL UNIQUE) ENGINE=InnoDB")
	t.Cleanup(func() {
		exec(t, connect(t, srv), "DROP TABLE IF EXISTS `"+other+"`", "DROP TABLE IF EXISTS cg_review_other.`"+table+"`")
	})
	exec(t, c, "INSERT INTO `"+table+"` (id, n, u) VALUES ('a', 0, 1), ('b', 0, 2), ('c', 0, 3), ('r', 0, 4), ('o', 0, 5), ('m', 0, 6), ('d', 0, 7), ('keep2', 0, 8)",
		"INSERT INTO `"+other+"` VALUES ('m', 0), ('d', 0)",
		"INSERT INTO cg_review_other.`"+table+"` (id) VALUES ('keep2'), ('a')")
	name := "review " + table
	db := relayedDB(t, srv, name)
	r, stop := runRaw(t, db, name, []follow.Table{{Table: table, Key: "id"}})
	q := func(s string) string {
		return strings.ReplaceAll(s, "@T", "`"+table+"`")
	}
	exec(t, c,
		q("UPDATE @T SET id = 'a2' WHERE id = 'a'"), // the key changes
		q("UPDATE @T SET id = 'B' WHERE id = 'b'"),  // one key under _ci: no change
		q("UPDATE @T SET n = n + 1"),                // no key changes
		q("UPDATE @T t JOIN `"+other+"` o ON o.id = t.id SET t.id = CONCAT(t.id, 'x'), o.v = 1 WHERE t.id = 'm'"), // multi-table
		q("DELETE t, o FROM @T t JOIN `"+other+"` o ON o.id = t.id WHERE t.id = 'd'"),                             // multi-table delete
		q("REPLACE INTO @T (id, n, u) VALUES ('r', 9, 4)"),                                                        // replaces the row in place
		q("REPLACE INTO @T (id, n, u) VALUES ('r2', 9, 3)"),                                                       // replaces the row of u = 3 ('c') with r2
		q("INSERT INTO @T (id, u) VALUES ('o', 5) ON DUPLICATE KEY UPDATE id = 'o2'"),                             // the key changes
		q("INSERT INTO @T (id, u) VALUES ('new', 5) ON DUPLICATE KEY UPDATE n = 7"),                               // u = 5 is o2's: no new key
		"DELETE FROM cg_review_other.`"+table+"` WHERE id = 'keep2'",                                              // another schema's table of the name
		"UPDATE cg_review_other.`"+table+"` SET id = 'zz' WHERE id = 'a'",
		"BEGIN", q("DELETE FROM @T WHERE id = 'B'"), q("INSERT INTO @T (id) VALUES ('b')"), "COMMIT", // one key out and in
		q("INSERT INTO @T (id) VALUES ('marker')"))
	for !r.has("MARKER") {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	count := map[string]int{}
	r.mu.Lock()
	for _, s := range r.commits {
		for _, c := range s {
			ch := c.Tables[0]
			if ch.Incomplete || ch.Truncated {
				t.Logf("commit %d makes the followers read the table", c.Pos)
			}
			for _, k := range ch.Creates {
				count[k]++
			}
			for _, k := range ch.Deletes {
				count[k]--
			}
		}
	}
	r.mu.Unlock()
	res, err := c.Execute("SELECT id FROM `" + table + "`")
	if err != nil {
		t.Fatal(err)
	}
	start := map[string]int{"A": 1, "B": 1, "C": 1, "R": 1, "O": 1, "M": 1, "D": 1, "KEEP2": 1}
	for i := range res.RowNumber() {
		id, _ := res.GetString(i, 0)
		k := strings.ToUpper(id)
		if start[k]+count[k] < 1 {
			t.Errorf("key %q is in the table, and counts %d after the commits: a wrong 404", id, start[k]+count[k])
		}
		delete(count, k)
	}
	for k, n := range count {
		if start[k]+n > 0 {
			t.Logf("key %s counts %d and is not in the table (a false positive)", k, start[k]+n)
		}
		if k == "ZZ" {
			t.Errorf("another schema's table of the name made commits of ours: %s", k)
		}
	}
}

// visibleHandler checks, at each commit it gets, that each key created is
// visible to a new snapshot on a connection of its own (the keys are
// never deleted).
type visibleHandler struct {
	*rawRecorder
	c        *client.Conn
	table    string
	checked  int
	invisble []string
}

func (h *visibleHandler) Commit(ctx context.Context, c *follow.Commit) error {
	for _, k := range c.Tables[0].Creates {
		r, err := h.c.Execute("SELECT COUNT(*) FROM `"+h.table+"` WHERE id = ?", k)
		if err != nil {
			return err
		}
		h.checked++
		if n, _ := r.GetInt(0, 0); n != 1 {
			h.invisble = append(h.invisble, k)
		}
	}
	return h.rawRecorder.Commit(ctx, c)
}

// TestReviewRelayVisibleAtCommit: four writers commit one-key
// transactions at once (group commits), and the handler looks each key
// up at its commit: the Source must hand on no commit before it is
// visible to new snapshots.
func TestReviewRelayVisibleAtCommit(t *testing.T) {
	srv := testDSN(t)
	fullMetadata(t, srv)
	table, _ := newTable(t, srv, "id VARCHAR(64) NOT NULL PRIMARY KEY", "")
	name := "review " + table
	db := relayedDB(t, srv, name)
	src, err := db.Source(name, []follow.Table{{Table: table, Key: "id"}}, follow.SourceConfig{Heartbeat: 50 * time.Millisecond, Deadline: 2 * time.Second,
		Backoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(testLog{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := &visibleHandler{rawRecorder: &rawRecorder{src: src}, c: connect(t, srv), table: table}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, h) }()
	for !src.Stats().Streaming {
		time.Sleep(5 * time.Millisecond)
	}
	var wg sync.WaitGroup
	const writers, each = 4, 250
	for w := range writers {
		c := connect(t, srv)
		wg.Go(func() {
			for i := range each {
				if _, err := c.Execute(fmt.Sprintf("INSERT INTO `%s` VALUES ('w%d_%d')", table, w, i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		h.mu.Lock()
		n := 0
		for _, s := range h.commits {
			for _, c := range s {
				n += len(c.Tables[0].Creates)
			}
		}
		h.mu.Unlock()
		if n >= writers*each {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d keys of %d", n, writers*each)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v", err)
	}
	t.Logf("%d keys looked up at their commit; visibility waits %d", h.checked, src.Stats().VisibilityWaits)
	if len(h.invisble) > 0 {
		t.Errorf("%d keys handed on before a new snapshot saw them: %v", len(h.invisble), h.invisble[:min(10, len(h.invisble))])
	}
}

// TestReviewRelayDDL runs DDL of issue 52's question 5 on a followed
// table, each followed by an insert: each must end in a commit that makes
// the followers read the table (Incomplete or Truncated), or a session
// whose Start names another version or identity of it (fanout resets the
// table); and keys of the table after it must come.
func TestReviewRelayDDL(t *testing.T) {
	srv := testDSN(t)
	fullMetadata(t, srv)
	for _, tc := range []struct {
		name  string
		stmts func(db, table string) []string
		// reread: the followers must read the table again.
		reread bool
	}{
		{"schema-qualified ALTER of the key's collation", func(db, table string) []string {
			return []string{"ALTER TABLE " + db + "." + table + " MODIFY id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"}
		}, true},
		{"commented, backquoted, upper-case ALTER", func(db, table string) []string {
			return []string{"/* review */ alter TABLE `" + db + "`.`" + table + "` ENGINE=InnoDB"}
		}, true},
		{"multi-table RENAME swap", func(db, table string) []string {
			return []string{"CREATE TABLE `" + table + "_new` LIKE `" + table + "`", "INSERT INTO `" + table + "_new` VALUES ('swapped')",
				"RENAME TABLE `" + table + "` TO `" + table + "_old`, `" + table + "_new` TO `" + table + "`"}
		}, true},
		{"DROP and CREATE", func(db, table string) []string {
			return []string{"DROP TABLE `" + table + "`", "CREATE TABLE `" + table + "` (id VARCHAR(64) NOT NULL PRIMARY KEY) ENGINE=InnoDB",
				"INSERT INTO `" + table + "` VALUES ('remade')"}
		}, true},
		{"TRUNCATE", func(db, table string) []string { return []string{"TRUNCATE `" + table + "`"} }, true},
		{"CREATE TABLE LIKE, and a table whose name has the table's in it", func(db, table string) []string {
			return []string{"CREATE TABLE `" + table + "_x` LIKE `" + table + "`", "INSERT INTO `" + table + "_x` VALUES ('x')", "DROP TABLE `" + table + "_x`"}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, c := newTable(t, srv, "id VARCHAR(64) NOT NULL PRIMARY KEY", "")
			t.Cleanup(func() {
				exec(t, connect(t, srv), "DROP TABLE IF EXISTS `"+table+"_new`", "DROP TABLE IF EXISTS `"+table+"_x`")
			})
			exec(t, c, "INSERT INTO `"+table+"` VALUES ('before')")
			name := "review " + table
			db := relayedDB(t, srv, name)
			r, stop := runRaw(t, db, name, []follow.Table{{Table: table, Key: "id"}})
			exec(t, c, tc.stmts(srv.db, table)...)
			exec(t, c, "INSERT INTO `"+table+"` VALUES ('after')")
			// AFTER comes, or a later session resets (it started past it).
			later := func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				return len(r.starts) > 1 && r.starts[len(r.starts)-1].Reset
			}
			for deadline := time.Now().Add(20 * time.Second); !r.has("AFTER") && !r.has("after") && !later(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					r.mu.Lock()
					t.Fatalf("AFTER never came; starts %d, stats %+v", len(r.starts), r.src.Stats())
				}
			}
			stop()
			reread := false
			r.mu.Lock()
			defer r.mu.Unlock()
			for i, st := range r.starts {
				if i > 0 && (st.Reset || st.Versions[0] != r.starts[0].Versions[0] || st.Identities[0] != r.starts[0].Identities[0]) {
					reread = true
				}
				for _, c := range r.commits[i] {
					reread = reread || c.Tables[0].Incomplete || c.Tables[0].Truncated
				}
			}
			if tc.reread && !reread {
				t.Errorf("no commit and no new session made the followers read the table again (%d sessions)", len(r.starts))
			}
			t.Logf("sessions %d, reread %v", len(r.starts), reread)
		})
	}
}

// TestReviewRelayLease: one holder at a time; a holder whose lock
// connection dies keeps Held true (by its clock) until its next Renew
// fails, while another takes the lease with a larger term: the window in
// which both may publish, which fanout's terms fence.
func TestReviewRelayLease(t *testing.T) {
	srv := testDSN(t)
	name := "review " + tableName(t)
	db := relayedDB(t, srv, name)
	ctx := context.Background()
	a, err := db.Lease(ctx, name, 5*time.Second, time.Second)
	if err != nil || a == nil {
		t.Fatalf("Lease = %v, %v", a, err)
	}
	defer a.Release()
	if b, err := db.Lease(ctx, name, 5*time.Second, time.Second); err != nil || b != nil {
		t.Fatalf("a second Lease while one holds it = %v, %v; want nil, nil", b, err)
	}
	c := connect(t, srv)
	r, err := c.Execute("SELECT IS_USED_LOCK(?)", lockName(name))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := r.GetInt(0, 0)
	exec(t, c, fmt.Sprintf("KILL %d", id))
	var b follow.Lease
	for deadline := time.Now().Add(5 * time.Second); b == nil; time.Sleep(10 * time.Millisecond) {
		if b, err = db.Lease(ctx, name, 5*time.Second, time.Second); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no one took the lease of a killed lock connection")
		}
	}
	defer b.Release()
	if b.Term() <= a.Term() {
		t.Errorf("terms %d then %d: not larger", a.Term(), b.Term())
	}
	t.Logf("after the kill: the old holder's Held = %v (term %d), the new one's = %v (term %d)", a.Held(time.Now()), a.Term(), b.Held(time.Now()), b.Term())
	if err := a.Renew(ctx, time.Second); err == nil {
		t.Errorf("Renew of a lease whose lock connection was killed succeeded")
	}
}
