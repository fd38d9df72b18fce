package mysql

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
)

// route is a follower's way to the server, through a TCP proxy that a test
// can take away (every connection closed, new ones refused) while it
// changes the server's history, and give back.
type route struct {
	p   *tcpproxy.Proxy
	srv server
}

// newRoute starts a proxy to srv; it stops when the test ends. Its via is
// the server to give a follower.
func newRoute(t *testing.T, srv server) (r *route, via server) {
	t.Helper()
	p, err := tcpproxy.Start(srv.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	via = srv
	via.host, via.port = splitAddr(t, p.Addr())
	return &route{p: p, srv: srv}, via
}

// away closes the follower's connections and refuses new ones.
func (r *route) away() {
	r.p.SetTarget("127.0.0.1:1")
	r.p.CloseConns()
}

// back forwards new connections to the server again.
func (r *route) back() { r.p.SetTarget(r.srv.addr()) }

// binlogAt is where the server's binlog ends now: its file, position and
// the sequence number of domain 0's last GTID.
type binlogAt struct {
	file string
	pos  int64
	seq  uint64
}

func masterAt(t *testing.T, c *client.Conn) binlogAt {
	t.Helper()
	r, err := c.Execute("SHOW MASTER STATUS")
	if err != nil {
		t.Fatal(err)
	}
	var b binlogAt
	b.file, _ = r.GetString(0, 0)
	b.pos, _ = r.GetInt(0, 1)
	r, err = c.Execute("SELECT @@GLOBAL.gtid_binlog_pos")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := r.GetString(0, 0)
	p, err := parseGTIDPos(text)
	if err != nil {
		t.Fatal(err)
	}
	b.seq = p[0].seq
	return b
}

// writePast commits one-row inserts of ids from id on until the server's
// binlog is past at, in at's file, with a later GTID: a history that a
// follower away since at would find at its position, were it only
// compared by file, size and GTID. It returns the next id.
func writePast(t *testing.T, c *client.Conn, table string, at binlogAt, id int) int {
	t.Helper()
	for {
		now := masterAt(t, c)
		if now.file != at.file {
			t.Fatalf("the binlog is in %s, want %s: the scenario needs the position's own file", now.file, at.file)
		}
		if now.pos > at.pos+4096 && now.seq > at.seq {
			return id
		}
		for range 100 {
			exec(t, c, fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, id))
			id++
		}
	}
}

// writeToStart commits one-row transactions of ids from the history's
// next one on, each row padded (REPEAT('x', 1000 to 4000): the statement
// the binlog annotates its rows with is of one length), until the binlog
// ends exactly at p.start, in p's file, and then more until its GTID is
// past p's: a new history with a transaction boundary where the
// follower's last transaction began, and the server's GTID not behind
// it. Only the transaction the stream sends from there tells it from the
// old one.
func writeToStart(t *testing.T, h *history, p resumePoint) {
	t.Helper()
	writeTo(t, h, p, "")
}

// writeIntoTransaction is writeToStart with a transaction's rows event,
// not its beginning, at p.start: a stream from there begins with rows
// whose table map came before it.
func writeIntoTransaction(t *testing.T, h *history, p resumePoint) {
	t.Helper()
	writeTo(t, h, p, "Write_rows")
}

// writeTo writes the history of writeToStart, with the event of a
// one-row insert named by kind ("" for its first) beginning at p.start.
func writeTo(t *testing.T, h *history, p resumePoint, kind string) {
	t.Helper()
	row := func(pad int) (grew, into int64) { // the bytes the binlog grew by; where kind's event begins in them
		t.Helper()
		before := masterAt(t, h.c)
		exec(t, h.c, fmt.Sprintf("INSERT INTO `%s` (id, pad) VALUES (%d, REPEAT('x', %d))", h.table, 1_000_000+h.id, pad))
		h.id++
		after := masterAt(t, h.c)
		if after.file != p.file {
			t.Fatalf("the binlog is in %s, want %s: the scenario needs the position's own file", after.file, p.file)
		}
		if kind != "" {
			r, err := h.c.Execute(fmt.Sprintf("SHOW BINLOG EVENTS IN '%s' FROM %d", after.file, before.pos))
			if err != nil {
				t.Fatal(err)
			}
			into = -1
			for i := range r.RowNumber() {
				typ, _ := r.GetString(i, 2)
				at, _ := r.GetInt(i, 1)
				if strings.HasPrefix(typ, kind) && at < after.pos {
					into = at - before.pos
					break
				}
			}
			if into < 0 {
				t.Fatalf("no %s event in the transaction at %s:%d", kind, after.file, before.pos)
			}
		}
		return after.pos - before.pos, into
	}
	grew, into := row(1000)
	base := grew - 1000             // a transaction's bytes besides its padding
	target := int64(p.start) - into // where the last transaction must begin
	for {
		rem := target - masterAt(t, h.c).pos
		switch {
		case rem == 0:
			if _, got := row(1000); got != into { // the same statement's length: the same layout
				t.Fatalf("the %s event began %d bytes into the transaction, was %d", kind, got, into)
			}
			for masterAt(t, h.c).seq <= p.gtid.seq {
				h.insert(t, 1)
			}
			return
		case rem-base >= 1000 && rem-base <= 4000:
			row(int(rem - base))
		case rem-base > 4000:
			row(int(min(4000, rem-2*base-1000))) // and leave room for the last one
		default:
			t.Fatalf("the binlog is %d bytes short of %d, less than a transaction of %d: the scenario cannot be made", rem, target, base+1000)
		}
	}
}

// purgeAll makes the current binlog file the first one: every earlier file
// is purged (once the server's binlog checkpoint has moved past them).
func purgeAll(t *testing.T, c *client.Conn) {
	t.Helper()
	exec(t, c, "FLUSH BINARY LOGS")
	file := masterAt(t, c).file
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		exec(t, c, "PURGE BINARY LOGS TO '"+file+"'")
		r, err := c.Execute("SHOW BINARY LOGS")
		if err != nil {
			t.Fatal(err)
		}
		if first, _ := r.GetString(0, 0); first == file {
			return
		}
	}
	t.Fatalf("the binlogs before %s were never purged", file)
}

// dataDir is the server of CUCKOOGUARD_MYSQL_RESTART, a script that
// (re)starts it with --datadir and --pid-file: its data directory can be
// copied aside with the server stopped, and restored.
type dataDir struct {
	script, dir, pidFile string
}

// serverDataDir reads the data directory and pid file from the restart
// script, or skips the test.
func serverDataDir(t *testing.T) dataDir {
	t.Helper()
	script := os.Getenv("CUCKOOGUARD_MYSQL_RESTART")
	if script == "" {
		t.Skip("set CUCKOOGUARD_MYSQL_RESTART to a script that restarts the server with --datadir and --pid-file (.ci/run does)")
	}
	text, err := os.ReadFile(script)
	if err != nil {
		t.Skipf("the restart command %q is not a script this test can read: %v", script, err)
	}
	arg := func(name string) string {
		m := regexp.MustCompile(`--` + name + `="?([^"\s]+)"?`).FindSubmatch(text)
		if m == nil {
			return ""
		}
		return string(m[1])
	}
	d := dataDir{script: script, dir: arg("datadir"), pidFile: arg("pid-file")}
	if d.dir == "" || d.pidFile == "" {
		t.Skipf("the restart script %s names no --datadir and --pid-file", script)
	}
	return d
}

// stop stops the server and waits until it has exited.
func (d dataDir) stop(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(d.pidFile)
	if err != nil {
		t.Fatalf("the server's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("the server's pid %q: %v", b, err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("stop the server (pid %d): %v", pid, err)
	}
	// A test that fails before it starts the server again must not leave
	// it stopped for the tests after it.
	t.Cleanup(func() {
		if b, err := os.ReadFile(d.pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && syscall.Kill(pid, 0) == nil {
				return
			}
		}
		if out, err := osexec.Command(d.script).CombinedOutput(); err != nil {
			t.Errorf("start the server again: %v: %s", err, out)
		}
	})
	for deadline := time.Now().Add(60 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server (pid %d) did not stop in 60 s", pid)
		}
	}
}

// start starts the stopped server and waits until it answers.
func (d dataDir) start(t *testing.T) {
	t.Helper()
	if out, err := osexec.Command(d.script).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", d.script, err, out)
	}
}

// copyTo copies the stopped server's data directory to dst.
func (d dataDir) copyTo(t *testing.T, dst string) {
	t.Helper()
	if out, err := osexec.Command("cp", "-a", d.dir, dst).CombinedOutput(); err != nil {
		t.Fatalf("copy %s to %s: %v: %s", d.dir, dst, err, out)
	}
}

// restoreFrom replaces the stopped server's data directory with src.
func (d dataDir) restoreFrom(t *testing.T, src string) {
	t.Helper()
	if err := os.RemoveAll(d.dir); err != nil {
		t.Fatal(err)
	}
	if out, err := osexec.Command("cp", "-a", src, d.dir).CombinedOutput(); err != nil {
		t.Fatalf("restore %s from %s: %v: %s", d.dir, src, err, out)
	}
}

// history is a follower, its route, and the table's writes, for the
// cases of TestResumeRefused.
type history struct {
	srv   server
	c     *client.Conn // to the server, around the route
	table string
	r     *route
	n     *node[int64]
	id    int // the next id to insert

	mu   sync.Mutex
	last resumePoint // where the follower's last session left it to resume from
}

// resumeFrom returns where the follower's last session left it to resume
// from.
func (h *history) resumeFrom() resumePoint {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// insert commits the next k ids in one transaction.
func (h *history) insert(t *testing.T, k int) {
	t.Helper()
	insertRange(t, h.c, h.table, h.id, h.id+k)
	h.id += k
}

// reconnect connects the test's connections again, after a restart.
func (h *history) reconnect(t *testing.T) {
	t.Helper()
	h.c = connect(t, h.srv)
	h.n.conn = connect(t, h.srv)
}

// TestResumeRefused takes a follower away from the server (its route
// refuses) while the server's binlog history is purged, reset or restored
// from a copy of its data directory, and other keys are committed; given
// its route back, the follower must not stream from its old position but
// read the table again, and then hold every committed key. The cases
// "written past the position" write until the new history is longer than
// the old one at the follower's position, in the same file, with a later
// GTID: only the stream's first transaction (not the one the follower
// applied there) tells them apart.
func TestResumeRefused(t *testing.T) {
	srv := testDSN(t)
	for _, tc := range []struct {
		name string
		// why matches the reason the follower gives for its read.
		why string
		// user: the follower connects as a user that may stream the
		// binlog but not list it (no BINLOG MONITOR).
		user bool
		// before runs before the follower starts; change while it is
		// away, which began with the binlog at at.
		before func(t *testing.T, h *history)
		change func(t *testing.T, h *history, at binlogAt)
	}{
		{name: "purged binlogs", why: "is gone",
			change: func(t *testing.T, h *history, at binlogAt) {
				purgeAll(t, h.c)
				h.insert(t, 100)
			}},
		{name: "purged binlogs, not listed", why: "1236", user: true,
			change: func(t *testing.T, h *history, at binlogAt) {
				purgeAll(t, h.c)
				h.insert(t, 100)
			}},
		{name: "reset master", why: "RESET MASTER",
			change: func(t *testing.T, h *history, at binlogAt) {
				exec(t, h.c, "RESET MASTER")
				h.insert(t, 100)
			}},
		{name: "reset master, written past the position", why: "1236|not the one the follower followed",
			before: func(t *testing.T, h *history) {
				exec(t, h.c, "RESET MASTER") // the follower's position is in the first file, which the next reset makes again
			},
			change: func(t *testing.T, h *history, at binlogAt) {
				exec(t, h.c, "RESET MASTER")
				h.id = writePast(t, h.c, h.table, at, h.id)
			}},
		{name: "reset master, written to the position", why: "not the one the follower followed",
			before: func(t *testing.T, h *history) {
				exec(t, h.c, "RESET MASTER")
			},
			change: func(t *testing.T, h *history, at binlogAt) {
				exec(t, h.c, "RESET MASTER")
				writeToStart(t, h, h.resumeFrom())
			}},
		{name: "reset master, written to inside a transaction", why: "not the one the follower followed.*cannot be decoded",
			before: func(t *testing.T, h *history) {
				exec(t, h.c, "RESET MASTER")
			},
			change: func(t *testing.T, h *history, at binlogAt) {
				exec(t, h.c, "RESET MASTER")
				writeIntoTransaction(t, h, h.resumeFrom())
			}},
		{name: "restored data directory", why: "ends at .*before the position|behind the position",
			change: func(t *testing.T, h *history, at binlogAt) { restored(t, h, "") }},
		{name: "restored data directory, written past the position", why: "1236|not the one the follower followed",
			change: func(t *testing.T, h *history, at binlogAt) { restored(t, h, "past") }},
		{name: "restored data directory, written to the position", why: "not the one the follower followed",
			change: func(t *testing.T, h *history, at binlogAt) { restored(t, h, "to") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasPrefix(tc.name, "restored") {
				serverDataDir(t) // or skip
			}
			h := &history{srv: srv}
			sessionEnded = func(p resumePoint) {
				h.mu.Lock()
				h.last = p
				h.mu.Unlock()
			}
			t.Cleanup(func() { sessionEnded = nil })
			h.table, h.c = newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT, pad VARCHAR(4000) NOT NULL DEFAULT ''", "")
			h.insert(t, 1000)
			if tc.before != nil {
				tc.before(t, h)
			}
			as := srv
			if tc.user {
				as = binlogUser(t, srv)
			}
			var via server
			h.r, via = newRoute(t, as)
			h.n = startNode(t, via, h.table, "id", parseInt64, WithBackoff(20*time.Millisecond))
			h.n.conn = connect(t, srv)
			h.n.waitCurrent(t)
			// Applied from the stream: the follower's position is past its
			// read, and it has deletions to release.
			h.insert(t, 100)
			exec(t, h.c, fmt.Sprintf("DELETE FROM `%s` WHERE id < 100", h.table))
			h.n.waitCurrent(t)
			h.r.away()
			h.n.waitFailed(t)
			before := h.n.follower.Stats()
			tc.change(t, h, masterAt(t, h.c))
			h.r.back()
			back := time.Now()
			// A read, or (wrongly) a resume: either way, check the keys.
			for st := h.n.follower.Stats(); st.FullReads == before.FullReads && st.Resumes == before.Resumes; st = h.n.follower.Stats() {
				if time.Since(back) > time.Minute {
					t.Fatalf("neither a read nor a resume in a minute: state %v, last error %v", st.State, st.LastError)
				}
				time.Sleep(5 * time.Millisecond)
			}
			took := h.n.waitCurrent(t) + time.Since(back)
			h.insert(t, 100) // and it follows
			checked, wrong := h.n.wrong404s(t, parseInt64)
			st := h.n.follower.Stats()
			t.Logf("following %v after the route came back; %d reads, %d resumes (were %d, %d); read because: %s; %d keys checked, %d wrong 404s",
				took.Round(time.Millisecond), st.FullReads, st.Resumes, before.FullReads, before.Resumes, st.ReadReason, checked, wrong)
			if wrong != 0 || checked == 0 {
				t.Fatalf("%d wrong 404s of %d committed keys", wrong, checked)
			}
			if st.FullReads == before.FullReads {
				t.Fatalf("it resumed (%d resumes, were %d) where it had to read the table", st.Resumes, before.Resumes)
			}
			if !regexp.MustCompile(tc.why).MatchString(st.ReadReason) {
				t.Fatalf("read because %q, want a reason that matches %q", st.ReadReason, tc.why)
			}
		})
	}
}

// waitFailed waits until n's session has ended, and so left where the
// next one may resume from.
func (n *node[K]) waitFailed(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); n.follower.Stats().State != PassThrough; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the session did not end in 30 s without its route")
		}
	}
}

// restored stops the server, copies its data directory aside, starts it,
// and commits keys, which the follower (given its route back for the
// while) resumes to and applies; then, the follower away again, it stops
// the server, restores the copy and starts it: the keys since the copy
// are gone from the server, and the follower's position is in a history
// that no longer exists. Then it commits other keys: past the follower's
// position (write "past"), to its start ("to"), or a few.
func restored(t *testing.T, h *history, write string) {
	t.Helper()
	d := serverDataDir(t)
	copied := filepath.Join(t.TempDir(), "data")
	d.stop(t)
	d.copyTo(t, copied)
	d.start(t)
	h.reconnect(t)
	gone := h.id
	h.insert(t, 500)
	resumes := h.n.follower.Stats().Resumes
	h.r.back()
	h.n.waitResume(t, resumes, time.Now())
	h.n.waitApplied(t)
	h.r.away()
	at := masterAt(t, h.c)
	h.n.waitFailed(t)
	d.stop(t)
	d.restoreFrom(t, copied)
	d.start(t)
	h.reconnect(t)
	t.Logf("restored the copy: the follower had resumed and applied up to %s:%d (GTID seq %d), keys %d to %d are gone, the server is at %+v",
		at.file, at.pos, at.seq, gone, h.id-1, masterAt(t, h.c))
	switch write {
	case "past":
		h.id = writePast(t, h.c, h.table, at, h.id)
	case "to":
		writeToStart(t, h, h.resumeFrom())
	default:
		h.insert(t, 100)
	}
}

// binlogUser returns srv as a user of its own that may stream the binlog
// (REPLICATION SLAVE) but not list it (SHOW BINARY LOGS needs BINLOG
// MONITOR), with what a follower needs of the database.
func binlogUser(t *testing.T, srv server) server {
	t.Helper()
	c := connect(t, srv)
	user := "cg_binlog_" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	exec(t, c, "CREATE USER '"+user+"'@'%' IDENTIFIED BY 'pw'",
		"GRANT REPLICATION SLAVE ON *.* TO '"+user+"'@'%'",
		"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `"+srv.db+"`.* TO '"+user+"'@'%'")
	t.Cleanup(func() { exec(t, connect(t, srv), "DROP USER IF EXISTS '"+user+"'@'%'") })
	as := srv
	as.user, as.password = user, "pw"
	uc := connect(t, as)
	if _, err := uc.Execute("SHOW BINARY LOGS"); err == nil {
		t.Fatalf("user %s may list the binlogs: the case needs one that may not", user)
	}
	return as
}
