package postgres

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestRestoredDatabase restores the server from a copy of its data
// directory taken a moment earlier, while a follower with a permanent slot
// follows and another connection writes: with the copy's slot (a storage
// snapshot keeps it, and the restored WAL ends behind the follower's
// position) and without it (a pg_basebackup has no slots). The follower
// must not say it follows what the database no longer has, nor miss what
// it commits after the restore (0 wrong 404s), and must follow again
// within followAgain of the server's return, without a restart.
//
// It needs the commands of .ci/run in CUCKOOGUARD_PG_BACKUP (stop the
// server, copy its data directory aside, start it) and
// CUCKOOGUARD_PG_RESTORE (stop it, put the copy in place, with the
// argument noslots without its slots, start it); nothing else may use the
// server meanwhile.
func TestRestoredDatabase(t *testing.T) {
	backup, restore := os.Getenv("CUCKOOGUARD_PG_BACKUP"), os.Getenv("CUCKOOGUARD_PG_RESTORE")
	if backup == "" || restore == "" {
		t.Skip("set CUCKOOGUARD_PG_BACKUP and CUCKOOGUARD_PG_RESTORE to the shell commands that copy the test server's data directory aside and put it back (.ci/run sets them); they stop and start the server")
	}
	run := func(t *testing.T, cmd string) time.Duration {
		t.Helper()
		begin := time.Now()
		if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		return time.Since(begin)
	}
	for _, tc := range []struct {
		name string
		arg  string // of the restore command
	}{
		{"with the slot", ""},
		{"without slots", "noslots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startChurn(t, 1000)
			time.Sleep(300 * time.Millisecond)
			// The copy: every row committed before it survives the restore.
			r.pause()
			kept := r.committed()
			took := run(t, backup)
			r.resume()
			r.waitFollowing(time.Now(), 30*time.Second)
			// Rows and heartbeats the restore takes back. The writer goes
			// on through the restore, as an application's would: a row
			// committed while the restore runs may be taken back or not,
			// and is not checked.
			time.Sleep(time.Second)
			r.doubt.Store(true)
			r.forget(kept)
			lost := r.committed() - kept
			before := r.a.follower.Stats()
			down := time.Now()
			run(t, restore+" "+tc.arg)
			up := time.Now()
			r.doubt.Store(false)
			back := r.waitFollowing(up, followAgain)
			after := r.a.follower.Stats()
			r.finish("restore "+tc.name, fmt.Sprintf("backup took %v; %d rows committed between the copy and the restore; restore took %v; A following again %v after the restore command returned; full reads %v before, %v after",
				took.Round(time.Millisecond), lost, up.Sub(down).Round(time.Millisecond), back.Round(time.Millisecond), before.FullReads, after.FullReads))
		})
	}
}
