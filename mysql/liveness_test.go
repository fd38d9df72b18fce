package mysql

import (
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
)

// TestFollowerStall stalls every connection of a follower (a TCP proxy
// stops forwarding, as a frozen route does; nothing is closed): the
// heartbeats stop coming back, the Loader's lease runs out and lookups
// pass through, the session is given up at the deadline, and once the
// route forwards again the follower resumes where it stopped, without
// reading the table, and follows, with a key inserted during the stall.
func TestFollowerStall(t *testing.T) {
	srv := testDSN(t)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY", "")
	insertRange(t, c, table, 0, 100)
	p, err := tcpproxy.Start(srv.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	via := srv
	host, port := splitAddr(t, p.Addr())
	via.host, via.port = host, port
	n := startNode(t, via, table, "id", parseInt64)
	n.conn = connect(t, srv) // the checks go around the proxy
	n.waitCurrent(t)
	failures := n.follower.Stats().Failures
	p.Stall()
	stalled := time.Now()
	exec(t, c, "INSERT INTO `"+table+"` (id) VALUES (1000)")
	committed := time.Now()
	var passAfter time.Duration
	for passAfter == 0 {
		if !n.loader.Ready() {
			passAfter = time.Since(stalled)
		}
		// The promise: a row committed more than the max lag ago is
		// never reported absent (one committed less long ago may be:
		// that is the staleness the lease allows).
		if !n.loader.MayContain(int64(1000)) && n.loader.Ready() && time.Since(committed) > DefaultMaxLag {
			t.Fatalf("a wrong 404 for 1000, committed %v ago during the stall", time.Since(committed))
		}
		if time.Since(stalled) > 30*time.Second {
			t.Fatal("the Loader stayed ready through a 30 s stall")
		}
		time.Sleep(time.Millisecond)
	}
	for n.follower.Stats().Failures == failures {
		if !n.loader.MayContain(int64(1000)) {
			t.Fatal("a wrong 404 for 1000 while the session is stalled")
		}
		if time.Since(stalled) > 30*time.Second {
			t.Fatal("the session was not given up in 30 s")
		}
		time.Sleep(time.Millisecond)
	}
	gaveUp := time.Since(stalled)
	before := n.follower.Stats()
	p.Resume()
	resumed := time.Now()
	again := n.waitResume(t, before.Resumes, resumed)
	checked, wrong := n.wrong404s(t, parseInt64)
	st := n.follower.Stats()
	t.Logf("stalled: lookups passed through after %v, the session given up after %v (%v); following again %v after the route resumed; %d keys checked, %d wrong 404s; %d reads of the table",
		passAfter.Round(time.Millisecond), gaveUp.Round(time.Millisecond), st.LastError, again.Round(time.Millisecond), checked, wrong, st.FullReads)
	if wrong != 0 || checked != 101 {
		t.Fatalf("%d wrong 404s of %d keys, want 0 of 101", wrong, checked)
	}
	if st.FullReads != before.FullReads {
		t.Fatalf("%d reads of the table after the stall, were %d: want a resume, no read", st.FullReads, before.FullReads)
	}
}
