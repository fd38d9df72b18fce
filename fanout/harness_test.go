package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// env is one test's PostgreSQL schema, NATS stream and bucket, removed at
// its end. The tests find the servers through CUCKOOGUARD_PG_DSN and
// CUCKOOGUARD_NATS_URL (.ci/run starts both) and skip without them.
type env struct {
	dsn    string // with search_path set to the schema
	nc     *nats.Conn
	opts   []Option // the stream, prefix and bucket of the test
	relays []string // relay names, whose slots go at the end; followers follow the last
	tables []string
	id     string
}

// bucket returns the test's object store bucket.
func (e *env) bucket() string { return "cg_snap_" + e.id }

func newEnv(t *testing.T) *env {
	t.Helper()
	dsn, url := os.Getenv("CUCKOOGUARD_PG_DSN"), os.Getenv("CUCKOOGUARD_NATS_URL")
	if dsn == "" || url == "" {
		t.Skip("set CUCKOOGUARD_PG_DSN and CUCKOOGUARD_NATS_URL (a nats-server with JetStream) to run (.ci/run starts both)")
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	id := fmt.Sprintf("%d", rand.Uint32())
	schema := "cg_fanout_" + id
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	e := &env{dsn: dsn + sep + "search_path=" + schema, nc: nc, id: id,
		opts: []Option{WithStream("CG_" + id), WithSubjectPrefix("cg" + id), WithSnapshots("cg_snap_"+id, 200*time.Millisecond, nil)}}
	t.Cleanup(func() {
		ctx := context.Background()
		if js, err := jetstream.New(nc); err == nil {
			js.DeleteStream(ctx, "CG_"+id)
			js.DeleteObjectStore(ctx, "cg_snap_"+id)
		}
		nc.Close()
		c, err := pgx.Connect(ctx, e.dsn)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer c.Close(ctx)
		for _, table := range e.tables {
			if err := postgres.Unpublish(ctx, c, table); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		for _, r := range e.relays {
			c.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, relaySlot(r))
			time.Sleep(50 * time.Millisecond)
			c.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, relaySlot(r))
		}
		c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	})
	return e
}

// testLogger logs to the test's log with CUCKOOGUARD_TEST_LOG set, else
// nowhere.
func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("CUCKOOGUARD_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// relaySlot returns the slot of relay name (postgres.NewSource's).
func relaySlot(name string) string { return postgres.SlotName(name) }

// exec runs each statement on a connection of its own: another process's
// writes.
func (e *env) exec(t *testing.T, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, q := range stmts {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// table makes a table of bigint keys with seed rows and publishes it.
func (e *env) table(t *testing.T, name string, seed int) {
	t.Helper()
	e.exec(t, fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, name text NOT NULL)`, name),
		fmt.Sprintf(`INSERT INTO %s SELECT g, 'seed' FROM generate_series(1, %d) g`, name, seed))
	c, err := pgx.Connect(context.Background(), e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if err := postgres.Publish(context.Background(), c, name, "id"); err != nil {
		t.Fatal(err)
	}
	e.tables = append(e.tables, name)
}

// startRelay runs a relay named name of tables until the test ends or
// its stop is called.
func (e *env) startRelay(t *testing.T, name string, tables ...string) (*Relay, func()) {
	t.Helper()
	var st []follow.Table
	for _, tb := range tables {
		st = append(st, follow.Table{Table: tb, Key: "id"})
	}
	return e.startRelayWith(t, name, st, nil)
}

// startRelayWith is startRelay of tables with opts after the test's.
func (e *env) startRelayWith(t *testing.T, name string, st []follow.Table, opts []Option) (*Relay, func()) {
	t.Helper()
	base := []Option{WithHeartbeat(50 * time.Millisecond), WithBackoff(20 * time.Millisecond), WithLogger(testLogger(t))}
	r, err := NewRelay(relayed(t, e.dsn), name, e.nc, st, append(append(base, e.opts...), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	e.relays = append(e.relays, name)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("relay %s: %v", name, err)
			}
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// node is a replica that follows a table through the relay's stream.
type node struct {
	id     string
	e      *env
	table  string
	pool   *pgxpool.Pool
	loader *guarded.Loader[int64, string]
	f      *Follower[int64]
	stop   func()
}

// startNode starts a node and waits until it follows with every change
// committed before it started.
func (e *env) startNode(t *testing.T, id, table string, opts ...Option) *node {
	t.Helper()
	return e.startNodeOn(t, e.nc, id, table, opts...)
}

// startNodeOn is startNode with the node's own NATS connection.
func (e *env) startNodeOn(t *testing.T, nc *nats.Conn, id, table string, opts ...Option) *node {
	t.Helper()
	n := e.newNode(t, nc, id, table, opts...)
	n.waitCurrent(t)
	return n
}

// newNode starts a node on nc, and does not wait for it to follow.
func (e *env) newNode(t *testing.T, nc *nats.Conn, id, table string, opts ...Option) *node {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(guard.WithCapacity(10_000))
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(ctx context.Context, k int64) (string, error) {
		var s string
		err := pool.QueryRow(ctx, `SELECT name FROM `+table+` WHERE id = $1`, k).Scan(&s)
		return s, err
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, string](lookup),
		guarded.WithNotFound(func(err error) bool { return errors.Is(err, pgx.ErrNoRows) }),
		guarded.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	base := []Option{WithOrigin(id), WithHeartbeat(50 * time.Millisecond), WithBackoff(20 * time.Millisecond)}
	if len(e.relays) > 0 {
		base = append(base, WithRelay(e.relays[len(e.relays)-1]))
	}
	base = append(base, WithLogger(testLogger(t)))
	opts = append(append(base, e.opts...), opts...)
	f, err := NewFollower(l, nc, relayed(t, e.dsn), table, "id", func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{id: id, e: e, table: table, pool: pool, loader: l, f: f}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	var once sync.Once
	n.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(func() {
		n.stop()
		l.Close()
		pool.Close()
	})
	return n
}

// waitCurrent waits until n follows with every change committed before
// the call.
func (n *node) waitCurrent(t *testing.T) {
	t.Helper()
	waitCurrent(t, n.id, n.f, n.loader)
}

// waitCurrent waits until f follows, with every change committed before
// the call, and its Loader l is ready; id names the node in the failure.
// currentWithin waits up to limit until f follows and every change
// committed before the call has been applied, and reports whether it did.
func currentWithin[K comparable, V any](f *Follower[K], l *guarded.Loader[K, V], limit time.Duration) bool {
	since := time.Now()
	for deadline := since.Add(limit); ; time.Sleep(5 * time.Millisecond) {
		st := f.Stats()
		if st.State == postgres.Following && l.Ready() && st.CurrentAsOf.After(since) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func waitCurrent[K comparable, V any](t *testing.T, id string, f *Follower[K], l *guarded.Loader[K, V]) {
	t.Helper()
	since := time.Now()
	for deadline := since.Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := f.Stats()
		if st.State == postgres.Following && l.Ready() && st.CurrentAsOf.After(since) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never followed with the changes before %v: %+v", id, since.Format(time.StampMilli), st)
		}
	}
}

// wrong404s reads every key of the table, waits until n is current, and
// counts the keys a ready Loader reports absent while their row still
// exists.
func (n *node) wrong404s(t *testing.T) (checked, wrong int) {
	t.Helper()
	ctx := context.Background()
	rows, err := n.pool.Query(ctx, `SELECT id FROM `+n.table)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	n.waitCurrent(t)
	for _, id := range ids {
		checked++
		if n.loader.MayContain(id) || !n.loader.Ready() {
			continue
		}
		var exists bool
		n.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+n.table+` WHERE id = $1)`, id).Scan(&exists)
		if exists {
			wrong++
			if wrong <= 5 {
				t.Logf("%s: wrong 404 for committed key %d", n.id, id)
			}
		}
	}
	return checked, wrong
}

// expectNoWrong404s fails the test if n reports a committed key absent.
func expectNoWrong404s(t *testing.T, n *node, what string) {
	t.Helper()
	checked, wrong := n.wrong404s(t)
	t.Logf("%s: %s: %d keys checked, %d wrong 404s", n.id, what, checked, wrong)
	if wrong != 0 {
		t.Errorf("%s: %s: %d wrong 404s among %d committed keys", n.id, what, wrong, checked)
	}
}

// insert inserts rows of ids through n's Loader, in one transaction that
// tags them.
func (n *node) insert(t *testing.T, ids ...int64) {
	t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		err := n.loader.Insert(ctx, id, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
				if err := n.f.Tag(ctx, postgres.ExecIn(tx), id); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+n.table+` VALUES ($1, $2)`, id, n.id)
				return err
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// tablesOf returns tables keyed by id.
func tablesOf(tables ...string) []follow.Table {
	var st []follow.Table
	for _, tb := range tables {
		st = append(st, follow.Table{Table: tb, Key: "id"})
	}
	return st
}

func itoa(i int) string { return strconv.Itoa(i) }

// natsViaProxy returns a NATS connection that reaches the test's server
// through a proxy the test can stall or cut, reconnecting for ever every
// 50 ms. Both are closed when the test ends.
func natsViaProxy(t *testing.T) (*tcpproxy.Proxy, *nats.Conn) {
	t.Helper()
	p, err := tcpproxy.Start(strings.TrimPrefix(os.Getenv("CUCKOOGUARD_NATS_URL"), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	nc, err := nats.Connect("nats://"+p.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return p, nc
}

// killRelaySessions ends the database sessions of relay name, its lease's
// and its stream's, as the death of its process would.
func (e *env) killRelaySessions(t *testing.T, name string) {
	t.Helper()
	c, err := pgx.Connect(context.Background(), e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name IN ($1, $2)`,
		"cuckooguard relay lock "+name, "cuckooguard relay stream "+name); err != nil {
		t.Fatal(err)
	}
}

// relayed returns the database at dsn as the relay and its followers
// reach it.
func relayed(t testing.TB, dsn string) follow.Database {
	t.Helper()
	db, err := postgres.Relayed(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return db
}
