package mysql

import (
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
)

// TestRestartFromSnapshotFile runs a follower with a snapshot file under
// two writers, stops it (a process that exits: it saves its guard), lets
// the writers go on, and starts another process's follower with the same
// file: it must restore the guard and stream on from the file's position
// without reading the table (0 reads), or read the table where the file
// cannot be proved, and then hold every committed key.
func TestRestartFromSnapshotFile(t *testing.T) {
	srv := testDSN(t)
	for _, tc := range []struct {
		name string
		// meanwhile runs while no follower runs.
		meanwhile func(t *testing.T, c *client.Conn, file string)
		// why matches the reason for a read of the table; "" for none.
		why string
		// other: the second follower follows another table.
		other bool
	}{
		{name: "restart"},
		{name: "restart, the server restarted meanwhile", meanwhile: func(t *testing.T, c *client.Conn, file string) {
			script := os.Getenv("CUCKOOGUARD_MYSQL_RESTART")
			if script == "" {
				t.Skip("set CUCKOOGUARD_MYSQL_RESTART to a command that restarts the server (.ci/run does)")
			}
			if out, err := osexec.Command(script).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", script, err, out)
			}
		}},
		{name: "binlogs purged meanwhile", why: "snapshot file: binlog file .* is gone", meanwhile: func(t *testing.T, c *client.Conn, file string) {
			purgeAll(t, c)
		}},
		{name: "binlog reset meanwhile", why: "snapshot file: (binlog file .* is gone|.*behind the position)", meanwhile: func(t *testing.T, c *client.Conn, file string) {
			exec(t, c, "RESET MASTER")
		}},
		{name: "damaged file", why: "snapshot file: .*checksum", meanwhile: func(t *testing.T, c *client.Conn, file string) {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			b[20] ^= 1
			if err := os.WriteFile(file, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "another table's file", why: "snapshot file: the file is of column id of .*", other: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "users.guard")
			table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
			const space = 10000
			insertRange(t, c, table, 0, space/4)
			w := startWriters(t, srv, table, 2, space)
			opts := []Option{WithSnapshotFile(file), WithSnapshotInterval(100 * time.Millisecond)}
			a := startNode(t, srv, table, "id", parseInt64, opts...)
			a.waitCurrent(t)
			time.Sleep(500 * time.Millisecond) // writes, and saves, under the writers
			a.halt(t)
			sa := a.follower.Stats()
			if sa.Snapshots == 0 {
				t.Fatalf("the first follower saved no snapshot: %+v", sa)
			}
			if tc.meanwhile != nil {
				tc.meanwhile(t, connect(t, srv), file)
			}
			time.Sleep(100 * time.Millisecond) // writes while no follower runs
			followed := table
			if tc.other {
				followed, c = newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
				insertRange(t, c, followed, 0, 100)
			}
			b := startNode(t, srv, followed, "id", parseInt64, opts...)
			b.waitCurrent(t)
			w.halt()
			checked, wrong := b.wrong404s(t, parseInt64)
			absent, rejected := 0, 0
			if !tc.other {
				absent, rejected = b.absentRejected(t, space, ident)
			}
			st := b.follower.Stats()
			t.Logf("the first follower saved %d snapshots; the second: %d reads (because: %q), %d restores, %d resumes; %d commits; %d keys checked, %d wrong 404s; %d of %d absent ids rejected",
				sa.Snapshots, st.FullReads, st.ReadReason, st.Restores, st.Resumes, w.commits.Load(), checked, wrong, rejected, absent)
			if wrong != 0 || checked == 0 {
				t.Fatalf("%d wrong 404s of %d committed keys", wrong, checked)
			}
			if tc.why == "" {
				if st.FullReads != 0 || st.Restores != 1 || st.Resumes != 1 {
					t.Fatalf("%d reads, %d restores, %d resumes; want 0, 1, 1", st.FullReads, st.Restores, st.Resumes)
				}
			} else if st.FullReads != 1 || !regexp.MustCompile(tc.why).MatchString(st.ReadReason) {
				t.Fatalf("%d reads because %q; want 1, because of something that matches %q", st.FullReads, st.ReadReason, tc.why)
			}
			if rejected < absent*9/10 {
				t.Fatalf("%d of %d absent ids rejected, want nearly all: deletions held at the exit were not released", rejected, absent)
			}
		})
	}
}
