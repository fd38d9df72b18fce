package fanout

import (
	"os"
	"testing"
	"time"
)

// TestStalenessWithDefaults runs replicas with the default heartbeat and
// max lag through the faults a fleet meets: the relay's process dies, the
// broker restarts, and another process loads 200,000 rows into a table
// nobody follows. A row committed 300 ms or more before a lookup never
// reads absent on a ready replica.
func TestStalenessWithDefaults(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 500)
	e.exec(t, `CREATE TABLE unrelated (id bigint PRIMARY KEY, pad text)`)
	name := "r_stale"
	relays := make([]*Relay, 2)
	for i := range relays {
		relays[i], _ = e.startRelayWith(t, name, tablesOf("users"), []Option{WithHeartbeat(DefaultRelayHeartbeat)})
	}
	defaults := []Option{WithHeartbeat(DefaultHeartbeat), WithMaxLag(DefaultMaxLag)}
	nodes := []*node{e.startNode(t, "a", "users", defaults...), e.startNode(t, "b", "users", defaults...)}
	l := startLoad(t, e, nodes, staleBound)
	settle := func(what string) {
		t.Helper()
		for _, n := range nodes {
			n.waitCurrent(t)
		}
		time.Sleep(500 * time.Millisecond)
		t.Logf("%s: %d Gets so far, %d while passing through, %d wrong 404s", what, l.gets.Load(), l.passing.Load(), l.wrong.Load())
	}
	time.Sleep(500 * time.Millisecond)

	// The relay's process dies: its sessions end.
	e.killRelaySessions(t, name)
	settle("relay killed")

	// 200,000 rows into a table nobody follows: the walsender decodes
	// them before it can pass the followers' heartbeats on.
	e.exec(t, `INSERT INTO unrelated SELECT g, repeat('x', 100) FROM generate_series(1, 200000) g`)
	settle("bulk load into an unfollowed table")

	if os.Getenv("CUCKOOGUARD_NATS_RESTART") != "" {
		restartNATS(t)
		settle("nats-server restarted")
	}
	l.halt()
	for _, n := range nodes {
		expectNoWrong404s(t, n, "after the faults, with the default settings")
	}
}
