package postgres

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
)

// TestStalenessWithDefaults follows with the default heartbeat and max lag
// through the faults a replica meets: its backend terminated, its
// connections silent for a second, 200,000 rows loaded into a table nobody
// follows, and (with CUCKOOGUARD_PG_RESTART) the server restarted. A row
// committed 300 ms or more before a lookup never reads absent on a ready
// replica.
func TestStalenessWithDefaults(t *testing.T) {
	var p *tcpproxy.Proxy
	r := startFaultRun(t, 10_000, DefaultHeartbeat, &p) // bound: 3 heartbeats, 300 ms (set before its checkers start: set after, it raced them)
	if r.bound != 300*time.Millisecond {
		t.Fatalf("bound %v, want 300ms", r.bound)
	}
	admin, err := pgx.Connect(context.Background(), r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(context.Background(), `CREATE TABLE unrelated (id bigint PRIMARY KEY, pad text)`); err != nil {
		t.Fatal(err)
	}
	settle := func(what string, fault time.Time) {
		t.Helper()
		back := r.waitReady(true, time.Minute)
		time.Sleep(500 * time.Millisecond)
		t.Logf("%s: following again %v after the fault began; %d Gets so far, %d wrong 404s, %d 404s within the bound",
			what, back.Sub(fault).Round(time.Millisecond), r.gets.Load(), r.wrong.Load(), r.stale.Load())
	}
	time.Sleep(500 * time.Millisecond)

	fault := time.Now()
	admin.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, int(r.a.follower.Stats().BackendPID))
	settle("backend terminated", fault)

	fault = time.Now()
	p.Stall()
	time.Sleep(time.Second)
	p.Resume()
	settle("connections silent for 1 s", fault)

	fault = time.Now()
	if _, err := admin.Exec(context.Background(), `INSERT INTO unrelated SELECT g, repeat('x', 100) FROM generate_series(1, 200000) g`); err != nil {
		t.Fatal(err)
	}
	settle("200,000 rows into an unfollowed table", fault)

	if cmd := os.Getenv("CUCKOOGUARD_PG_RESTART"); cmd != "" {
		fault = time.Now()
		if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		settle("server restarted", fault)
	}
	r.report("the default settings under faults")
	if r.wrong.Load() > 0 {
		t.Fatalf("%d wrong 404s with the default settings", r.wrong.Load())
	}
}
