package fanout

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// pgCommand runs the shell command in environment variable name, with
// args, and fails the test if it fails.
func pgCommand(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := os.Getenv(name)
	if len(args) > 0 {
		cmd += " " + strings.Join(args, " ")
	}
	if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
}

// TestRestoreThroughRelay restores the database under two replicas that
// follow users through a relay to a copy of its data directory taken
// earlier (CUCKOOGUARD_PG_BACKUP saves one, CUCKOOGUARD_PG_RESTORE puts it
// back: same system identifier, transaction ids and LSNs rewound), once
// with the relay's slot in the copy (a storage snapshot) and once without
// (as after pg_basebackup), while another process commits a row every
// millisecond. The relay of the restored database takes a smaller term
// than the replicas saw; it finds the database went back, and the
// replicas read the table again and follow again within 5 s of the
// restore, with no restart and no wrong 404 (the rows committed after the
// copy are gone, and rightly read absent).
func TestRestoreThroughRelay(t *testing.T) {
	if os.Getenv("CUCKOOGUARD_PG_BACKUP") == "" || os.Getenv("CUCKOOGUARD_PG_RESTORE") == "" {
		t.Skip("set CUCKOOGUARD_PG_BACKUP and CUCKOOGUARD_PG_RESTORE (commands that save the server's data directory and put it back; nothing else may use the server) to run")
	}
	fr := startFaultRun(t, "r_restore", 500)
	for _, c := range []struct {
		name string
		args []string
	}{
		{"restored with the relay's slot", nil},
		{"restored without slots", []string{"noslots"}},
	} {
		pgCommand(t, "CUCKOOGUARD_PG_BACKUP")
		fr.followAgain(t, c.name+": after the copy", time.Now())
		// The rows of a history that the restore will undo, each in a
		// transaction of its own, and the followers' heartbeats: the
		// terms and LSNs the replicas see go past the copy's.
		time.Sleep(1500 * time.Millisecond)
		wrong := fr.load.wrong.Load()
		pgCommand(t, "CUCKOOGUARD_PG_RESTORE", c.args...)
		end := time.Now()
		following := fr.followAgain(t, c.name, end)
		fenced := int64(0)
		for _, n := range fr.nodes {
			fenced += n.f.Stats().Fenced
		}
		t.Logf("%s: following again %v after the restore; %d wrong 404s since the copy; %d messages fenced in all",
			c.name, following.Round(time.Millisecond), fr.load.wrong.Load()-wrong, fenced)
	}
	fr.finish(t, "after the restores")
}
