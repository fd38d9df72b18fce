package mysql

import (
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// followerID is the server id of TestFaults' followers.
const followerID = 1<<30 + 52

// killStreams ends every binlog dump connection of the server: the
// followers' streams.
func killStreams(t *testing.T, c *client.Conn) int {
	t.Helper()
	r, err := c.Execute("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'")
	if err != nil {
		t.Fatal(err)
	}
	for i := range r.RowNumber() {
		id, _ := r.GetInt(i, 0)
		if _, err := c.Execute(fmt.Sprintf("KILL %d", id)); err != nil && !strings.Contains(err.Error(), "Unknown thread") {
			t.Fatal(err)
		}
	}
	return r.RowNumber()
}

// waitRead waits until n has read the table more than reads times, then
// until it is current; it returns how long that took since from.
func (n *node[K]) waitRead(t *testing.T, reads int64, from time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for n.follower.Stats().FullReads <= reads {
		if time.Now().After(deadline) {
			st := n.follower.Stats()
			t.Fatalf("no new read of the table: state %v, last error %v, reads %d, resumes %d", st.State, st.LastError, st.FullReads, st.Resumes)
		}
		time.Sleep(5 * time.Millisecond)
	}
	n.waitCurrent(t)
	return time.Since(from)
}

// waitResume waits until n has resumed more than resumes times (a
// session that streamed on from where the last one stopped), then until
// it is current; it returns how long that took since from.
func (n *node[K]) waitResume(t *testing.T, resumes int64, from time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for n.follower.Stats().Resumes <= resumes {
		if time.Now().After(deadline) {
			st := n.follower.Stats()
			t.Fatalf("no resume: state %v, last error %v, reads %d, resumes %d", st.State, st.LastError, st.FullReads, st.Resumes)
		}
		time.Sleep(5 * time.Millisecond)
	}
	n.waitCurrent(t)
	return time.Since(from)
}

// outcome is what a fault must end in.
type outcome int

const (
	wantGoesOn outcome = iota // the session goes on: no new session
	wantResume                // a new session that resumes, and no read of the table
	wantRead                  // a new read of the table
	wantEither                // a resume or a read
)

func (o outcome) String() string {
	return [...]string{"the session goes on", "a resume", "a read", "a resume or a read"}[o]
}

// absentRejected counts the ids in [0, space) the table does not hold and
// the guard rejects, once the deletes before the call are applied.
func (n *node[K]) absentRejected(t *testing.T, space int64, key func(int64) K) (absent, rejected int) {
	t.Helper()
	present := make(map[string]bool)
	for _, k := range n.keys(t) {
		present[k] = true
	}
	n.waitApplied(t)
	// The guard itself, not the Loader: a lease that lapsed for a moment
	// on a loaded machine would pass the Loader's lookups through, and
	// this counts what the guard holds.
	g := n.loader.Guard()
	for id := range space {
		if present[fmt.Sprint(id)] {
			continue
		}
		absent++
		if !g.ContainsHash(n.loader.Hash(key(id))) {
			rejected++
		}
	}
	return absent, rejected
}

func ident(id int64) int64 { return id }

// TestModelWriters starts a follower while four writers commit random
// inserts, deletes and key updates, kills its stream under them several
// times (each next session resumes where the last one stopped, without
// reading the table), and then checks every committed key: no gap between
// the read and its stream or between two sessions, no change applied
// twice or lost, no deletion held at a session's end lost or applied
// twice.
func TestModelWriters(t *testing.T) {
	srv := testDSN(t)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	const space = 20000
	insertRange(t, c, table, 0, space/4)
	w := startWriters(t, srv, table, 4, space)
	n := startNode(t, srv, table, "id", parseInt64)
	t.Logf("following %v after a start under 4 writers", n.waitCurrent(t))
	restarts := 6
	if testing.Short() {
		restarts = 2
	}
	var took []time.Duration
	for range restarts {
		resumed := n.follower.Stats().Resumes
		at := time.Now()
		if killStreams(t, c) == 0 {
			t.Fatal("no binlog stream to kill")
		}
		took = append(took, n.waitResume(t, resumed, at).Round(time.Millisecond))
	}
	w.halt()
	checked, wrong := n.wrong404s(t, parseInt64)
	absent, rejected := n.absentRejected(t, space, ident)
	st := n.follower.Stats()
	t.Logf("%d commits by 4 writers (%d refused); %d reads of the table, %d resumes; following again %v after each killed stream; %d keys checked, %d wrong 404s; %d of %d absent ids rejected; %d changes applied",
		w.commits.Load(), w.errs.Load(), st.FullReads, st.Resumes, took, checked, wrong, rejected, absent, st.Applied)
	if wrong != 0 {
		t.Fatalf("%d wrong 404s of %d committed keys", wrong, checked)
	}
	if st.FullReads != 1 {
		t.Fatalf("%d reads of the table, want 1: every killed stream must resume", st.FullReads)
	}
	if checked == 0 || rejected < absent*9/10 {
		t.Fatalf("%d keys checked, %d of %d absent ids rejected: want keys, and nearly every absent id rejected", checked, rejected, absent)
	}
}

// purgedAt is when the purged position's test purged the binlog: the
// follower's goroutine sets it, before its next session.
var purgedAt time.Time

// TestFaults makes each fault or operation under a follower while two
// writers commit, and checks that it follows again (reading the table
// where it must) with every committed key.
func TestFaults(t *testing.T) {
	srv := testDSN(t)
	for _, tc := range []struct {
		name string
		// want is what the fault must end in. A transaction whose commit
		// takes longer than the heartbeat deadline holds back every
		// heartbeat behind it: the session is given up, and the next one
		// resumes after the last transaction applied (either).
		want  outcome
		setup func(t *testing.T, table string)
		do    func(t *testing.T, c *client.Conn, table string)
	}{
		{name: "flush binary logs", want: wantGoesOn, do: func(t *testing.T, c *client.Conn, table string) {
			exec(t, c, "FLUSH BINARY LOGS")
		}},
		{name: "lost stream", want: wantResume, do: func(t *testing.T, c *client.Conn, table string) {
			killStreams(t, c)
		}},
		{name: "server restart", want: wantResume, do: func(t *testing.T, c *client.Conn, table string) {
			script := os.Getenv("CUCKOOGUARD_MYSQL_RESTART")
			if script == "" {
				t.Skip("set CUCKOOGUARD_MYSQL_RESTART to a command that restarts the server (.ci/run does)")
			}
			if out, err := osexec.Command(script).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", script, err, out)
			}
		}},
		{name: "purged position", want: wantRead, setup: func(t *testing.T, table string) {
			// Between the first read and its stream, the binlog the
			// read's position is in is purged: the stream fails at its
			// first read (1236), and the next session reads again.
			var once sync.Once
			c := connect(t, srv)
			afterRead = func() {
				once.Do(func() {
					// A file is purged only once the server no longer
					// needs it for crash recovery (its binlog checkpoint):
					// under writers that takes a moment.
					if _, err := c.Execute("FLUSH BINARY LOGS"); err != nil {
						t.Error(err)
						return
					}
					r, err := c.Execute("SHOW MASTER STATUS")
					if err != nil {
						t.Error(err)
						return
					}
					file, _ := r.GetString(0, 0)
					for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
						if _, err := c.Execute("PURGE BINARY LOGS TO '" + file + "'"); err != nil {
							t.Error(err)
							return
						}
						r, err := c.Execute("SHOW BINARY LOGS")
						if err != nil {
							t.Error(err)
							return
						}
						if first, _ := r.GetString(0, 0); first == file {
							purgedAt = time.Now()
							return
						}
					}
					t.Errorf("the binlogs before %s were never purged", file)
				})
			}
			t.Cleanup(func() { afterRead = nil })
		}},
		{name: "same server id", want: wantResume, do: func(t *testing.T, c *client.Conn, table string) {
			// Another reader registers with the follower's server id: the
			// server drops the follower's stream (4052).
			r, err := c.Execute("SHOW MASTER STATUS")
			if err != nil {
				t.Fatal(err)
			}
			file, _ := r.GetString(0, 0)
			pos, _ := r.GetInt(0, 1)
			other := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{ServerID: followerID, Flavor: gomysql.MariaDBFlavor,
				Host: srv.host, Port: srv.port, User: srv.user, Password: srv.password, DisableRetrySync: true, Logger: quiet})
			defer other.Close()
			if _, err := other.StartSync(gomysql.Position{Name: file, Pos: uint32(pos)}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "alter add column first", want: wantRead, do: func(t *testing.T, c *client.Conn, table string) {
			exec(t, c, "ALTER TABLE `"+table+"` ADD COLUMN pre INT NOT NULL DEFAULT 7 FIRST")
		}},
		{name: "rename swap", want: wantRead, do: func(t *testing.T, c *client.Conn, table string) {
			exec(t, c, "CREATE TABLE `"+table+"_new` LIKE `"+table+"`",
				"INSERT INTO `"+table+"_new` (id) SELECT id + 1000000 FROM `"+table+"` WHERE id % 3 = 0",
				"RENAME TABLE `"+table+"` TO `"+table+"_old`, `"+table+"_new` TO `"+table+"`")
		}},
		{name: "drop and create", want: wantRead, do: func(t *testing.T, c *client.Conn, table string) {
			exec(t, c, "DROP TABLE `"+table+"`",
				"CREATE TABLE `"+table+"` (id BIGINT NOT NULL PRIMARY KEY, v INT) ENGINE=InnoDB",
				"INSERT INTO `"+table+"` (id) VALUES (2000001), (2000002)")
		}},
		{name: "truncate", want: wantRead, do: func(t *testing.T, c *client.Conn, table string) {
			exec(t, c, "TRUNCATE TABLE `"+table+"`")
		}},
		{name: "statement format write", want: wantRead, do: func(t *testing.T, c *client.Conn, table string) {
			exec(t, c, "SET SESSION binlog_format = 'STATEMENT'",
				"INSERT INTO `"+table+"` (id) VALUES (3000001)",
				"SET SESSION binlog_format = 'ROW'")
		}},
		{name: "large transaction", want: wantEither, do: func(t *testing.T, c *client.Conn, table string) {
			insertRange(t, c, table, 4000000, 4000000+100000)
		}},
		{name: "transaction over the cap", want: wantRead, setup: func(t *testing.T, table string) {
			maxTxKeys = 5000
			t.Cleanup(func() { maxTxKeys = 1 << 20 })
		}, do: func(t *testing.T, c *client.Conn, table string) {
			insertRange(t, c, table, 5000000, 5000000+6000)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
			const space = 10000
			insertRange(t, c, table, 0, space/4)
			if tc.setup != nil {
				tc.setup(t, table)
			}
			w := startWriters(t, srv, table, 2, space)
			n := startNode(t, srv, table, "id", parseInt64, WithServerID(followerID))
			n.waitCurrent(t)
			before := n.follower.Stats()
			at := time.Now()
			var took time.Duration
			if !purgedAt.IsZero() {
				took = time.Since(purgedAt) // at most: waitCurrent waited for a heartbeat since
				purgedAt = time.Time{}
			}
			if tc.do != nil {
				tc.do(t, c, table)
				switch tc.want {
				case wantRead:
					took = n.waitRead(t, before.FullReads, at)
				case wantResume:
					took = n.waitResume(t, before.Resumes, at)
				case wantEither:
					for st := n.follower.Stats(); st.Failures == before.Failures && time.Since(at) < 5*time.Second; st = n.follower.Stats() {
						time.Sleep(5 * time.Millisecond)
					}
					took = n.waitCurrent(t)
				default:
					took = n.waitCurrent(t)
				}
			}
			n.conn = connect(t, srv) // the server may have restarted
			w.halt()
			checked, wrong := n.wrong404s(t, parseInt64)
			absent, rejected := n.absentRejected(t, space, ident)
			st := n.follower.Stats()
			t.Logf("following %v after it; %d reads, %d resumes, %d failed sessions (last: %v); %d commits; %d keys checked, %d wrong 404s; %d of %d absent ids rejected",
				took.Round(time.Millisecond), st.FullReads, st.Resumes, st.Failures, st.LastError, w.commits.Load(), checked, wrong, rejected, absent)
			if wrong != 0 || checked == 0 {
				t.Fatalf("%d wrong 404s of %d committed keys", wrong, checked)
			}
			if tc.do != nil {
				read, resumed := st.FullReads > before.FullReads, st.Resumes > before.Resumes
				bad := false
				switch tc.want {
				case wantGoesOn:
					bad = read || resumed || st.Failures > before.Failures
				case wantResume:
					bad = read || !resumed
				case wantRead:
					bad = !read
				}
				if bad {
					t.Fatalf("%d reads and %d resumes, were %d and %d: want %v", st.FullReads, st.Resumes, before.FullReads, before.Resumes, tc.want)
				}
			}
			if tc.do == nil && (st.FullReads < 2 || !strings.Contains(fmt.Sprint(st.LastError), "cannot be read")) {
				t.Fatalf("%d reads, last error %v: want the purged position to end the first session", st.FullReads, st.LastError)
			}
			if rejected < absent*9/10 {
				t.Fatalf("%d of %d absent ids rejected, want nearly all", rejected, absent)
			}
		})
	}
}
