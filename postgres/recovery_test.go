package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestBackoff(t *testing.T) {
	for _, tc := range []struct{ first, max time.Duration }{
		{100 * time.Millisecond, MaxBackoff},
		{time.Second, time.Second},
		{time.Nanosecond, time.Microsecond},
	} {
		t.Run(fmt.Sprintf("first=%v/max=%v", tc.first, tc.max), func(t *testing.T) {
			b := newBackoff(tc.first, tc.max)
			bound := tc.first
			for i := range 40 {
				d := b.next()
				if d < bound/2 || d > bound {
					t.Fatalf("wait %d = %v, want within [%v, %v]", i, d, bound/2, bound)
				}
				if d > tc.max {
					t.Fatalf("wait %d = %v, over the cap %v", i, d, tc.max)
				}
				bound = min(2*bound, tc.max)
			}
			b.reset()
			if d := b.next(); d > tc.first {
				t.Fatalf("wait after reset = %v, want at most %v", d, tc.first)
			}
		})
	}
}

// killListen terminates r's LISTEN backend and waits until its follower
// follows again with a new one. It returns how long that took.
func killListen(t *testing.T, admin *pgx.Conn, r *replica) time.Duration {
	t.Helper()
	pid := r.follower.Stats().BackendPID
	start := time.Now()
	var ok bool
	if err := admin.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, int(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
	for deadline := start.Add(30 * time.Second); ; runtime.Gosched() {
		st := r.follower.Stats()
		if st.State == Following && st.BackendPID != pid && st.BackendPID != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never followed again after the kill: %+v", st)
		}
	}
	return time.Since(start)
}

// TestFollowerBackoffAfterHealthySessions is the second defect of the
// client-found issue: the reconnect delay doubled with every fault and
// never came down, so kills separated by healthy stretches met 16 to 40 s
// waits. A session that followed for longer than the heartbeat deadline
// starts the delays over; a session that fails at once still doubles
// them, so a database that keeps failing is not hammered.
func TestFollowerBackoffAfterHealthySessions(t *testing.T) {
	const (
		first     = 40 * time.Millisecond
		heartbeat = 50 * time.Millisecond // deadline 150 ms
		kills     = 6
	)
	dsn := setupUsers(t, 100)
	r := startReplicaVia(t, dsn, dsn, "A", WithBackoff(first), WithHeartbeat(heartbeat), WithHeartbeatDeadline(3*heartbeat))
	admin, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())

	var took []time.Duration
	for i := range kills {
		// Longer than the heartbeat deadline: a healthy session. The
		// follower's clock, not ours, decides what "followed" means, so
		// give it a margin.
		time.Sleep(3 * 3 * heartbeat)
		took = append(took, killListen(t, admin, r))
		if d := r.follower.Stats().RetryDelay; d > first {
			t.Fatalf("kill %d after a healthy session: waited %v before reconnecting, want at most the first delay %v", i, d, first)
		}
	}
	t.Logf("following again after kills separated by healthy sessions: %v", took)

	// Kills as soon as it follows: each wait bound doubles.
	var waits []time.Duration
	for range 4 {
		killListen(t, admin, r)
		waits = append(waits, r.follower.Stats().RetryDelay)
	}
	t.Logf("waits after kills without a healthy session: %v", waits)
	if last := waits[len(waits)-1]; last < 4*first {
		t.Fatalf("the 4th consecutive failure waited %v, want at least %v (the delay doubles)", last, 4*first)
	}
	st := r.follower.Stats()
	if st.FailuresByReason[ReasonTerminated] != kills+4 || st.LastErrorReason != ReasonTerminated {
		t.Fatalf("%d killed sessions counted as %v, last reason %q; want %d as %q", kills+4, st.FailuresByReason, st.LastErrorReason, kills+4, ReasonTerminated)
	}
}

// TestFollowerLagGrowsWhileSilent is part of the fifth defect: the lag
// moved in steps and froze while no heartbeat came back. Through a proxy
// that stops forwarding, the lag must grow with the time since the last
// heartbeat that came back, through the dead session and the reconnects
// that cannot get through, and come down once the follower follows again.
func TestFollowerLagGrowsWhileSilent(t *testing.T) {
	const heartbeat = 50 * time.Millisecond
	dsn := setupUsers(t, 100)
	p, via := viaProxy(t, dsn)
	r := startReplicaVia(t, dsn, via, "A", WithHeartbeat(heartbeat), WithBackoff(20*time.Millisecond))
	time.Sleep(3 * heartbeat) // a few heartbeats back
	if st := r.follower.Stats(); st.LastHeartbeat.IsZero() || time.Since(st.LastHeartbeat) > 2*heartbeat {
		t.Fatalf("no heartbeat back in the last two intervals while following: %+v", st)
	}
	p.Stall()
	stalled := time.Now()
	var last time.Duration
	var states []State
	for time.Since(stalled) < 20*heartbeat {
		time.Sleep(heartbeat / 2)
		st := r.follower.Stats()
		if st.Lag < last {
			t.Fatalf("lag went down from %v to %v %v after the stall, with nothing back (state %v)", last, st.Lag, time.Since(stalled), st.State)
		}
		last = st.Lag
		if len(states) == 0 || states[len(states)-1] != st.State {
			states = append(states, st.State)
		}
	}
	elapsed := time.Since(stalled)
	t.Logf("lag %v after %v of silence; states %v", last, elapsed, states)
	// The oldest heartbeat out left at most one interval after the
	// stall began; allow one more for scheduling.
	if last < elapsed-2*heartbeat {
		t.Fatalf("lag %v after %v of silence, want at least %v", last, elapsed, elapsed-2*heartbeat)
	}
	if st := r.follower.Stats(); st.State == Following {
		t.Fatalf("still following after %v of silence: %+v", elapsed, st)
	}
	p.Resume()
	p.CloseConns() // the stalled sessions' bytes are stale
	r.waitFollowing(t)
	if lag := r.follower.Stats().Lag; lag > 3*heartbeat {
		t.Fatalf("lag %v once following again, want it back under the deadline", lag)
	}
}

// TestFollowerThroughTransactionPooler is the fourth defect: through a
// PgBouncer in transaction pooling mode, 2 of 10 follower starts ended as
// "LISTEN connection is dead" (the liveness check fired before the marker
// check), and later sessions failed on prepared statements that the
// pooler's shared server connections already had. Every start must fail
// with ErrNoNotifications, counted and logged with its reason.
// CUCKOOGUARD_PGBOUNCER_DSN names such a bouncer in front of the server of
// CUCKOOGUARD_PG_DSN (.ci/run starts one).
func TestFollowerThroughTransactionPooler(t *testing.T) {
	bouncer := os.Getenv("CUCKOOGUARD_PGBOUNCER_DSN")
	if bouncer == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("CI=true but CUCKOOGUARD_PGBOUNCER_DSN is not set: .ci/run starts a PgBouncer in transaction pooling mode")
		}
		t.Skip("set CUCKOOGUARD_PGBOUNCER_DSN to a PgBouncer in transaction pooling mode in front of CUCKOOGUARD_PG_DSN's server")
	}
	ctx := context.Background()
	db, _ := pgConn(t)
	var schema string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	// A bouncer cannot pass search_path at connect: name the table with
	// its schema, for the trigger's channel too.
	table := schema + ".users"
	if _, err := db.Exec(ctx, `CREATE TABLE `+table+` (id BIGINT PRIMARY KEY, name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, db, table, "id"); err != nil {
		t.Fatal(err)
	}
	const starts = 10
	for i := range starts {
		l := emptyLoader(t)
		var logs syncBuffer
		f, err := NewFollower(l, bouncer, table, "id", parseID, WithNotify(), WithHeartbeat(100*time.Millisecond),
			WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err = f.Run(rctx)
		cancel()
		ready := l.Ready()
		l.Close()
		st := f.Stats()
		if !errors.Is(err, ErrNoNotifications) {
			t.Fatalf("start %d through a transaction-pooling bouncer: Run = %v, want ErrNoNotifications\n%s", i, err, logs.String())
		}
		if ready {
			t.Fatalf("start %d: the Loader was ready though nothing arrived", i)
		}
		if st.LastErrorReason != ReasonNoNotifications || st.FailuresByReason[ReasonNoNotifications] != 1 {
			t.Fatalf("start %d: reason %q, failures %v; want one %q", i, st.LastErrorReason, st.FailuresByReason, ReasonNoNotifications)
		}
		if out := logs.String(); strings.Count(out, "reason=no_notifications") != 1 {
			t.Fatalf("start %d: log %q, want one line with reason=no_notifications", i, out)
		}
		if i == 0 {
			t.Logf("Run = %v", err)
		}
	}
}

// syncBuffer is a bytes.Buffer for a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRefusedConnectionRetriesSoon: while the server refuses connections
// (down: restarting, being restored), the follower retries after its
// first delay each time rather than doubling it, so that it looks soon
// after the server's return; a restored database is recognised only if
// it looks before the restored history's new WAL passes its position
// (TestRestoredDatabase, where doubled waits reached 2 s in a CI run).
func TestRefusedConnectionRetriesSoon(t *testing.T) {
	dsn := setupUsers(t, 10)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close() // nothing listens there: connections are refused
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = closed
	first := 20 * time.Millisecond // startNode's WithBackoff
	a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{followDSN: u.String(), noWait: true})
	for deadline := time.Now().Add(30 * time.Second); a.follower.Stats().Failures < 12; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("12 refused connections never came: %+v", a.follower.Stats())
		}
	}
	st := a.follower.Stats()
	t.Logf("after %d refused connections: the last wait %v (%v)", st.Failures, st.RetryDelay, st.LastError)
	if st.RetryDelay > first || st.FailuresByReason[ReasonConnect] < 12 {
		t.Fatalf("wait %v after %d refused connections (%v), want at most the first delay %v", st.RetryDelay, st.Failures, st.FailuresByReason, first)
	}
}
