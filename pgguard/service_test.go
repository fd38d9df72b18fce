package pgguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// env is a test's schema of two tables, orders (ids the database
// generates) and customers (keyed by a citext e-mail), and its NATS
// connection. The tests find the servers through CUCKOOGUARD_PG_DSN and
// CUCKOOGUARD_NATS_URL and skip without them.
type env struct {
	dsn     string
	pool    *pgxpool.Pool
	nc      *nats.Conn
	service string
}

func newEnv(t *testing.T, withNATS bool) *env {
	t.Helper()
	dsn, url := os.Getenv("CUCKOOGUARD_PG_DSN"), os.Getenv("CUCKOOGUARD_NATS_URL")
	if dsn == "" || withNATS && url == "" {
		t.Skip("set CUCKOOGUARD_PG_DSN and CUCKOOGUARD_NATS_URL (.ci/run starts both)")
	}
	ctx := context.Background()
	id := fmt.Sprint(rand.Uint32())
	schema := "cg_pgguard_" + id
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{"CREATE EXTENSION IF NOT EXISTS citext", "CREATE SCHEMA " + schema,
		"CREATE TABLE " + schema + ".orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL)",
		"CREATE TABLE " + schema + ".customers (email citext PRIMARY KEY, name text NOT NULL)",
		"INSERT INTO " + schema + ".orders (customer) SELECT 'seed' FROM generate_series(1, 1000)",
		"INSERT INTO " + schema + ".customers SELECT 'Seed' || g || '@Example.com', 'seed' FROM generate_series(1, 200) g"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	e := &env{dsn: dsn + sep + "search_path=" + schema + ",public", service: "svc_" + id}
	if e.pool, err = pgxpool.New(ctx, e.dsn); err != nil {
		t.Fatal(err)
	}
	if withNATS {
		if e.nc, err = nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if err := Teardown(ctx, e.pool, e.nc, e.service, "orders", "customers"); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if e.nc != nil {
			e.nc.Close()
		}
		e.pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		e.pool.Close()
	})
	return e
}

type order struct{ Customer string }
type customer struct{ Name string }

// replica is one replica of the test's service.
type replica struct {
	svc       *Service
	orders    *Table[int64, order]
	customers *Table[string, customer]
}

// start starts a replica named origin, logging to log (nil: nowhere).
func (e *env) start(t *testing.T, origin string, log *slog.Logger) *replica {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &replica{
		orders: &Table[int64, order]{Name: "orders", Column: "id", Get: func(ctx context.Context, id int64) (order, error) {
			var o order
			return o, e.pool.QueryRow(ctx, `SELECT customer FROM orders WHERE id = $1`, id).Scan(&o.Customer)
		}},
		customers: &Table[string, customer]{Name: "customers", Column: "email", Get: func(ctx context.Context, email string) (customer, error) {
			var c customer
			return c, e.pool.QueryRow(ctx, `SELECT name FROM customers WHERE email = $1::citext`, email).Scan(&c.Name)
		}},
	}
	svc, err := Start(context.Background(), Config{Pool: e.pool, NATS: e.nc, Service: e.service, Origin: origin, Logger: log}, r.orders, r.customers)
	if err != nil {
		t.Fatal(err)
	}
	r.svc = svc
	t.Cleanup(func() { svc.Close() })
	return r
}

// waitReady waits until every replica is ready, with the writes committed
// before the call.
func waitReady(t *testing.T, rs ...*replica) {
	t.Helper()
	since := time.Now()
	for _, r := range rs {
		for deadline := since.Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if r.svc.Ready() && r.current(since) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a replica never got ready: %s", readyz(t, r.svc))
			}
		}
	}
}

// current reports whether both tables' followers have applied what was
// committed before since.
func (r *replica) current(since time.Time) bool {
	for _, asOf := range []time.Time{r.orders.asOf(), r.customers.asOf()} {
		if !asOf.After(since) {
			return false
		}
	}
	return true
}

func (t *Table[K, V]) asOf() time.Time {
	if f, ok := t.f.(*fanout.Follower[K]); ok {
		return f.Stats().CurrentAsOf
	}
	return t.f.(*postgres.Follower[K]).Stats().CurrentAsOf
}

func (t *Table[K, V]) reads() map[string]int64 {
	if f, ok := t.f.(*fanout.Follower[K]); ok {
		return f.Stats().Reads
	}
	out := map[string]int64{}
	for k, v := range t.f.(*postgres.Follower[K]).Stats().FullReads {
		out[string(k)] = v
	}
	return out
}

// readyz returns what the Service answers on /readyz.
func readyz(t *testing.T, s *Service) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	b, _ := io.ReadAll(rec.Body)
	return fmt.Sprintf("%d %s", rec.Code, strings.TrimSpace(string(b)))
}

// checkKeys looks up every committed key of both tables, in the forms a
// client would send them, on every replica: a ready replica must not
// answer ErrNotFound for any.
func (e *env) checkKeys(t *testing.T, rs ...*replica) (checked int) {
	t.Helper()
	ctx := context.Background()
	rows, _ := e.pool.Query(ctx, `SELECT id FROM orders`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	rows, _ = e.pool.Query(ctx, `SELECT email::text FROM customers`)
	emails, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, rs...)
	for i, r := range rs {
		for _, id := range ids {
			checked++
			if !r.orders.Loader().MayContain(id) {
				t.Errorf("replica %d: order %d, committed, reads absent", i, id)
			}
		}
		for _, email := range emails {
			// As a client types it: in another case.
			for _, form := range []string{email, strings.ToUpper(email), strings.ToLower(email)} {
				checked++
				k, err := r.customers.Key(form)
				if err != nil {
					t.Fatalf("Key(%q): %v", form, err)
				}
				if _, err := r.customers.Loader().Get(ctx, k); err != nil {
					t.Errorf("replica %d: customer %q (%q), committed: %v", i, form, k, err)
				}
			}
		}
	}
	return checked
}

// recorder keeps the log records at Warn and above.
type recorder struct {
	mu    *sync.Mutex
	lines *[]string
}

func newRecorder() *recorder { return &recorder{mu: &sync.Mutex{}, lines: new([]string)} }

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelWarn {
		r.mu.Lock()
		*r.lines = append(*r.lines, rec.Level.String()+" "+rec.Message)
		r.mu.Unlock()
	}
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// TestFleetThroughRelay starts three replicas of a service of two tables
// through NATS, all at once: they get ready with no line at Warn, each
// reads each table once, the database holds one slot for them all, and
// every key committed by another client, before and after, is found on
// every replica, e-mails in any case. /readyz says so, and the collector
// gathers.
func TestFleetThroughRelay(t *testing.T) {
	e := newEnv(t, true)
	rec := newRecorder()
	log := slog.New(rec)
	var rs []*replica
	for _, origin := range []string{"a", "b", "c"} {
		rs = append(rs, e.start(t, origin, log))
	}
	if got := readyz(t, rs[0].svc); rs[0].svc.Ready() || !strings.HasPrefix(got, "503") {
		t.Logf("before the first follow: %s", got) // it may be ready already; usually not
	}
	waitReady(t, rs...)
	e.pool.Exec(context.Background(), `INSERT INTO orders (customer) SELECT 'later' FROM generate_series(1, 100)`)
	e.pool.Exec(context.Background(), `INSERT INTO customers VALUES ('Alice@Example.com', 'Alice'), ('ÉLODIE@exemple.fr', 'Élodie')`)
	checked := e.checkKeys(t, rs...)
	t.Logf("%d lookups of committed keys on 3 replicas", checked)
	for i, r := range rs {
		if got := readyz(t, r.svc); got != "200 ready" {
			t.Errorf("replica %d: /readyz = %q", i, got)
		}
		for _, reads := range []map[string]int64{r.orders.reads(), r.customers.reads()} {
			if len(reads) != 1 || reads["start"] != 1 {
				t.Errorf("replica %d read a table for %v, want once", i, reads)
			}
		}
	}
	if w := *rec.lines; len(w) > 0 {
		t.Errorf("a healthy first start logged at Warn: %q", w)
	}
	var slots int
	e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, postgres.SlotName(e.service)).Scan(&slots)
	if slots != 1 {
		t.Errorf("%d relay slots, want 1", slots)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(rs[0].svc); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = true
	}
	for _, name := range []string{"cuckooguard_loader_ready", "cuckooguard_follower_state", "cuckooguard_fanout_relay_leading", "cuckooguard_fanout_nats_connected"} {
		if !found[name] {
			t.Errorf("no %s among the gathered metrics", name)
		}
	}
}

// TestDirectAndReadyz runs one replica without NATS (a follower per
// table) and checks /readyz: 503 naming each table while it cannot follow
// (the publication of customers dropped under it), 200 once it can again.
func TestDirectAndReadyz(t *testing.T) {
	e := newEnv(t, false)
	r := e.start(t, "a", nil)
	waitReady(t, r)
	e.pool.Exec(context.Background(), `INSERT INTO customers VALUES ('Bob@Example.com', 'Bob')`)
	t.Logf("%d lookups of committed keys", e.checkKeys(t, r))
	if got := readyz(t, r.svc); got != "200 ready" {
		t.Errorf("/readyz = %q", got)
	}
	// Unpublished under it: the follower of customers passes through.
	if err := postgres.Unpublish(context.Background(), e.pool, "customers"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); r.svc.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("still ready 10 s after its table was unpublished")
		}
	}
	got := readyz(t, r.svc)
	t.Logf("/readyz: %s", got)
	if !strings.HasPrefix(got, "503") || !strings.Contains(got, "customers: ") || strings.Contains(got, "orders: ") {
		t.Errorf("/readyz = %q, want 503 naming customers alone", got)
	}
	if err := postgres.Publish(context.Background(), e.pool, "customers", "email"); err != nil {
		t.Fatal(err)
	}
	waitReady(t, r)
}

// TestStartRefuses: what Start cannot work with is an error, not a
// half-started service.
func TestStartRefuses(t *testing.T) {
	e := newEnv(t, false)
	get := func(context.Context, int64) (order, error) { return order{}, nil }
	for _, c := range []struct {
		name   string
		cfg    Config
		tables []Guarded
	}{
		{"no pool", Config{Service: "x"}, []Guarded{&Table[int64, order]{Name: "orders", Column: "id", Get: get}}},
		{"no service", Config{Pool: e.pool}, []Guarded{&Table[int64, order]{Name: "orders", Column: "id", Get: get}}},
		{"no table", Config{Pool: e.pool, Service: "x"}, nil},
		{"no Get", Config{Pool: e.pool, Service: "x"}, []Guarded{&Table[int64, order]{Name: "orders", Column: "id"}}},
		{"a key type without a Parse", Config{Pool: e.pool, Service: "x"}, []Guarded{&Table[[16]byte, order]{Name: "orders", Column: "id",
			Get: func(context.Context, [16]byte) (order, error) { return order{}, nil }}}},
		{"no such table", Config{Pool: e.pool, Service: "x"}, []Guarded{&Table[int64, order]{Name: "nowhere", Column: "id", Get: get}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Start(context.Background(), c.cfg, c.tables...)
			if err == nil {
				s.Close()
				t.Fatal("no error")
			}
			t.Logf("%v", err)
		})
	}
	var nilTable *Table[int64, order]
	if _, err := Start(context.Background(), Config{Pool: e.pool, Service: "x"}, nilTable); err == nil || !errors.Is(err, err) {
		t.Fatal("a nil table: no error")
	}
}

// TestTeardownLeavesNothing runs a relayed service, stops it, and tears
// it down: no slot, publication, stream, bucket or consumer of it is left.
func TestTeardownLeavesNothing(t *testing.T) {
	e := newEnv(t, true)
	r := e.start(t, "a", nil)
	waitReady(t, r)
	r.svc.Close()
	ctx := context.Background()
	if err := Teardown(ctx, e.pool, e.nc, e.service, "orders", "customers"); err != nil {
		t.Fatal(err)
	}
	var slots, pubs int
	e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, postgres.SlotName(e.service)).Scan(&slots)
	e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE schemaname = current_schema()`).Scan(&pubs)
	js, _ := jetstream.New(e.nc)
	consumers := 0
	if s, err := js.Stream(ctx, "CUCKOOGUARD"); err == nil {
		for ci := range s.ListConsumers(ctx).Info() {
			if strings.Contains(ci.Config.FilterSubject, ".svc_") && strings.Contains(ci.Config.FilterSubject, e.service) {
				consumers++
			}
		}
		si, _ := s.Info(ctx, jetstream.WithSubjectFilter("cuckooguard.*."+strings.ToLower(e.service)+"*.>"))
		if si != nil && len(si.State.Subjects) > 0 {
			t.Errorf("messages of the service left in the stream: %v", si.State.Subjects)
		}
	}
	objects := 0
	if obs, err := js.ObjectStore(ctx, "cuckooguard_snapshots"); err == nil {
		infos, _ := obs.List(ctx)
		for _, info := range infos {
			if strings.Contains(info.Name, e.service) {
				objects++
			}
		}
	}
	t.Logf("after teardown: %d slots, %d published tables, %d consumers, %d saved guards of the service", slots, pubs, consumers, objects)
	if slots+pubs+consumers+objects != 0 {
		t.Errorf("teardown left %d slots, %d published tables, %d consumers, %d saved guards", slots, pubs, consumers, objects)
	}
}
