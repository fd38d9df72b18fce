package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
)

// TestFollowerBehindPassesThrough gives a follower a max lag no
// notification can meet: after the first late notification it must
// invalidate its Loader, so that lookups pass through.
func TestFollowerBehindPassesThrough(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 10)
	r := startReplica(t, dsn, "A")
	r.halt()
	f, err := NewFollower(r.loader, dsn, "users", "id", parseID, WithOrigin("A"), WithMaxLag(time.Nanosecond))
	if err != nil {
		t.Fatal(err)
	}
	r.follower = f
	r.run()
	// The marker's own round trip is later than 1 ns: the follower may
	// be behind as soon as it has read the table.
	for deadline := time.Now().Add(30 * time.Second); f.Stats().Resyncs == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("follower never read the table: %+v", f.Stats())
		}
		runtime.Gosched()
	}
	w, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	if _, err := w.Exec(ctx, `INSERT INTO users VALUES (11, 'late')`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.Stats().State != Behind {
		if time.Now().After(deadline) {
			t.Fatalf("follower never fell behind: %+v", f.Stats())
		}
		runtime.Gosched()
	}
	if r.loader.Ready() {
		t.Fatal("a follower that is behind left its Loader ready")
	}
	if _, err := r.loader.Get(ctx, 11); err != nil {
		t.Fatalf("Get(11) while behind = %v", err)
	}
	t.Logf("lag of the late notification: %v", f.Stats().Lag)
}

// viaProxy returns a proxy in front of the server of dsn and dsn rewritten
// to go through it.
func viaProxy(t *testing.T, dsn string) (*tcpproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tcpproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	return p, u.String()
}

// TestFollowerBlackhole puts replica A's follower behind a proxy that
// stops forwarding bytes without closing anything, as a NAT that dropped
// the connection's state would. A must notice through its heartbeat and
// pass lookups through within the heartbeat deadline (plus one wait),
// rows committed on replica B during the blackout must read as present on
// A from then on, and once the proxy forwards again A must resync and
// follow.
func TestFollowerBlackhole(t *testing.T) {
	for _, m := range followModes {
		t.Run(m.name, func(t *testing.T) { testFollowerBlackhole(t, m.opts, m.resumes) })
	}
}

func testFollowerBlackhole(t *testing.T, opts []Option, resumes bool) {
	ctx := context.Background()
	dsn := setupUsers(t, 100)
	p, viaDSN := viaProxy(t, dsn)
	const heartbeat = 100 * time.Millisecond
	a := startReplicaVia(t, dsn, viaDSN, "A", append([]Option{WithHeartbeat(heartbeat)}, opts...)...)
	b := startReplicaVia(t, dsn, dsn, "B", opts...)
	deadline := 3 * heartbeat
	p.Stall()
	stalled := time.Now()
	var ids []int64
	for i := range 20 {
		id := int64(5000 + i)
		if err := b.insert(ctx, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for a.loader.Ready() {
		if time.Since(stalled) > 10*deadline {
			t.Fatalf("A still ready %v after the blackout began: %+v", time.Since(stalled), a.follower.Stats())
		}
		runtime.Gosched()
	}
	passThrough := time.Since(stalled)
	t.Logf("blackout to pass-through: %v (heartbeat %v, deadline %v); A: %+v", passThrough, heartbeat, deadline, a.follower.Stats())
	if passThrough > deadline+heartbeat/2 {
		t.Errorf("pass-through %v after the blackout, want within the deadline %v (and scheduling slack)", passThrough, deadline)
	}
	check := func(when string) {
		t.Helper()
		for _, id := range ids {
			if _, err := a.loader.Get(ctx, id); err != nil {
				t.Fatalf("%s: A.Get(%d) of a row committed on B = %v", when, id, err)
			}
		}
	}
	check("during the blackout")
	// Behind first (the oldest heartbeat out is older than the max lag),
	// then dead (nothing at all for the deadline): the session ends, and
	// the next one must resync.
	for a.follower.Stats().HeartbeatsLost == 0 {
		if time.Since(stalled) > 10*deadline {
			t.Fatalf("A's session still alive %v after the blackout began: %+v", time.Since(stalled), a.follower.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("blackout to the session given up: %v", time.Since(stalled))
	check("after the session was given up")
	p.Resume()
	resumed := time.Now()
	a.waitFollowing(t)
	t.Logf("resume to following: %v; A: %+v", time.Since(resumed), a.follower.Stats())
	check("after the blackout")
	for i := range 5 {
		id := int64(6000 + i)
		if err := b.insert(ctx, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	converge(t, []*replica{a, b}, func() []int64 {
		live := slices.Clone(ids)
		for id := range int64(100) {
			live = append(live, id+1) // seeded
		}
		return live
	})
	if st := a.follower.Stats(); st.HeartbeatsLost == 0 {
		t.Fatalf("A did not lose its heartbeat: %+v", st)
	}
	checkResumed(t, a, resumes)
}

// TestFollowerCannotListen points a follower at a connection that accepts
// LISTEN and delivers nothing (a proxy that drops notification messages,
// as a PgBouncer in transaction pooling mode does): Run must fail with
// ErrNoNotifications within the heartbeat deadline instead of leaving the
// Loader passing through for good.
func TestFollowerCannotListen(t *testing.T) {
	dsn := setupUsers(t, 10)
	p, viaDSN := viaProxy(t, dsn)
	p.DropPostgresMessages('A') // NotificationResponse
	l := emptyLoader(t)
	defer l.Close()
	f, err := NewFollower(l, viaDSN, "users", "id", parseID, WithNotify(), WithHeartbeat(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err = f.Run(ctx)
	t.Logf("Run = %v after %v", err, time.Since(start))
	if !errors.Is(err, ErrNoNotifications) {
		t.Fatalf("Run through a connection that delivers no notifications = %v, want ErrNoNotifications", err)
	}
	if l.Ready() {
		t.Fatal("the Loader is ready though its follower never received anything")
	}
}

// TestFollowerNotInstalled starts a follower on a table without the
// trigger (Install forgotten, or run for another name): it would hear its
// own heartbeats and nothing else, so Run must refuse with
// ErrNotInstalled instead of following.
func TestFollowerNotInstalled(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	if _, err := db.Exec(ctx, `CREATE TABLE users (id BIGINT PRIMARY KEY, name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := db.Config()
	dsn := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&search_path=%s", cfg.User, cfg.Host, cfg.Port, cfg.Database, schema)
	for _, table := range []string{"users", "nosuchtable"} {
		l := emptyLoader(t)
		f, err := NewFollower(l, dsn, table, "id", parseID, WithNotify(), WithHeartbeat(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = f.Run(rctx)
		cancel()
		l.Close()
		t.Logf("%s: Run = %v", table, err)
		if !errors.Is(err, ErrNotInstalled) {
			t.Fatalf("Run on %s without the trigger = %v, want ErrNotInstalled", table, err)
		}
	}
}
