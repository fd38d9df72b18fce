package mysqlguard

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-mysql-org/go-mysql/driver" // database/sql's "mysql", the service's pool
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/mysql"
)

// env is a test's two tables, orders (BIGINT ids) and customers (keyed by
// a utf8mb4_general_ci e-mail: 'Alice@Example.com' = 'alice@example.com'),
// in the database of CUCKOOGUARD_MYSQL_DSN, and the service's pool.
type env struct {
	dsn       string // the followers', go-sql-driver's form
	db        *sql.DB
	nc        *nats.Conn // with newRelayEnv
	service   string
	orders    string
	customers string
}

// newEnv makes the tables, seeded with 1,000 orders and 200 customers, and
// turns gtid_strict_mode on (for tokens) until the test ends. It skips
// without CUCKOOGUARD_MYSQL_DSN, and fails without it under CI=true.
func newEnv(t *testing.T) *env {
	t.Helper()
	dsn := os.Getenv("CUCKOOGUARD_MYSQL_DSN")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and CUCKOOGUARD_MYSQL_DSN is unset: .ci/run starts a MariaDB server and sets it")
		}
		t.Skip("set CUCKOOGUARD_MYSQL_DSN=root@tcp(127.0.0.1:3306)/db to run against MariaDB (.ci/run starts one)")
	}
	// go-mysql's database/sql driver takes user:password@host:port/db.
	db, err := sql.Open("mysql", strings.Replace(strings.Replace(dsn, "@tcp(", "@", 1), ")/", "/", 1))
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprint(rand.Uint32())
	e := &env{dsn: dsn, db: db, service: "svc_" + id, orders: "orders_" + id, customers: "customers_" + id}
	ctx := context.Background()
	var strict int
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_strict_mode").Scan(&strict); err != nil {
		t.Fatal(err)
	}
	var values, people []string
	for i := 1; i <= 1000; i++ {
		values = append(values, fmt.Sprintf("(%d, 'seed')", i))
	}
	for i := 1; i <= 200; i++ {
		people = append(people, fmt.Sprintf("('Seed%d@Example.com', 'seed')", i))
	}
	for _, q := range []string{
		"SET GLOBAL gtid_strict_mode = ON",
		"CREATE TABLE " + e.orders + " (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(20) NOT NULL) ENGINE=InnoDB",
		"CREATE TABLE " + e.customers + " (email VARCHAR(100) NOT NULL PRIMARY KEY, name VARCHAR(50) NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci",
		"INSERT INTO " + e.orders + " VALUES " + strings.Join(values, ","),
		"INSERT INTO " + e.customers + " VALUES " + strings.Join(people, ","),
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%.80s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		if err := Teardown(ctx, db, Config{Service: e.service, DSN: e.dsn, NATS: e.nc}, e.orders, e.customers); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if e.nc != nil {
			e.nc.Close()
		}
		db.ExecContext(ctx, "DROP TABLE IF EXISTS "+e.orders+", "+e.customers)
		db.ExecContext(ctx, fmt.Sprintf("SET GLOBAL gtid_strict_mode = %d", strict))
		db.Close()
	})
	return e
}

type order struct{ Note string }
type customer struct{ Name string }

// replica is one replica of the test's service.
type replica struct {
	svc       *Service
	orders    *Table[int64, order]
	customers *Table[string, customer]
}

// start starts the replica origin, saving its guards in dir ("": none).
// Lookups under a token wait for it up to 10 s, so that one the stream
// has not reached is seen (a pass-through would hide it).
func (e *env) start(t *testing.T, origin, dir string) *replica {
	t.Helper()
	wait := []guarded.Option{guarded.WithTokenWait(10 * time.Second)}
	r := &replica{
		orders: &Table[int64, order]{Name: e.orders, Column: "id", Capacity: 4096, Options: wait,
			Get: func(ctx context.Context, id int64) (order, error) {
				var o order
				return o, e.db.QueryRowContext(ctx, "SELECT note FROM "+e.orders+" WHERE id = ?", id).Scan(&o.Note)
			}},
		customers: &Table[string, customer]{Name: e.customers, Column: "email", Options: wait,
			Get: func(ctx context.Context, email string) (customer, error) {
				var c customer
				return c, e.db.QueryRowContext(ctx, "SELECT name FROM "+e.customers+" WHERE email = ?", email).Scan(&c.Name)
			}},
	}
	svc, err := Start(context.Background(), Config{DB: e.db, DSN: e.dsn, Service: e.service, Origin: origin, SnapshotDir: dir,
		NATS: e.nc, SnapshotEvery: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}, r.orders, r.customers)
	if err != nil {
		t.Fatal(err)
	}
	r.svc = svc
	t.Cleanup(func() { svc.Close() })
	return r
}

// waitReady waits until every replica is ready, with the writes committed
// before the call applied.
func waitReady(t *testing.T, rs ...*replica) {
	t.Helper()
	since := time.Now()
	for _, r := range rs {
		for deadline := since.Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if r.svc.Ready() && r.orders.asOf().After(since) && r.customers.asOf().After(since) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a replica never got ready: %s", readyz(t, r.svc))
			}
		}
	}
}

// asOf returns the time before which the table's follower, direct or
// relayed, has applied every commit.
func (t *Table[K, V]) asOf() time.Time {
	if t.rf != nil {
		return t.rf.Stats().CurrentAsOf
	}
	return t.f.Stats().CurrentAsOf
}

// readyz returns what the Service answers on /readyz.
func readyz(t *testing.T, s *Service) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	b, _ := io.ReadAll(rec.Body)
	return fmt.Sprintf("%d %s", rec.Code, strings.TrimSpace(string(b)))
}

// checkKeys waits for the replicas to be ready and current, then looks up
// every committed key of both tables on each, e-mails in three forms a
// client may send: none may read absent, and every order must be in the
// guard itself. It returns the lookups made.
func (e *env) checkKeys(t *testing.T, rs ...*replica) (checked int) {
	t.Helper()
	ctx := context.Background()
	ids := column[int64](t, e.db, "SELECT id FROM "+e.orders)
	emails := column[string](t, e.db, "SELECT email FROM "+e.customers)
	waitReady(t, rs...)
	for i, r := range rs {
		for _, id := range ids {
			checked++
			l := r.orders.Loader()
			if !l.MayContain(id) {
				t.Errorf("replica %d: order %d, committed, reads absent", i, id)
			}
			// The guard's own answer, ready or not: a check that a
			// replica passing lookups through would not pass.
			if !l.Guard().ContainsHash(l.Hash(id)) {
				t.Errorf("replica %d: order %d, committed, is not in the guard", i, id)
			}
		}
		for _, email := range emails {
			for _, form := range []string{email, strings.ToUpper(email), strings.ToLower(email)} {
				checked++
				k, err := r.customers.Key(form)
				if err != nil {
					t.Fatalf("Key(%q): %v", form, err)
				}
				if _, err := r.customers.Loader().Get(ctx, k); err != nil {
					t.Errorf("replica %d: customer %q (%q), committed: %v", i, form, email, err)
				}
			}
		}
	}
	return checked
}

func column[T any](t *testing.T, db *sql.DB, q string) []T {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTwoReplicas runs two replicas of a service of two tables while
// another client writes: /readyz is 503 naming the table its follower
// cannot read yet (orders, locked), 200 once both follow; an order
// created through replica a is found at once on replica b under its token
// (and so is a customer in another case than the column's one text);
// every committed key reads present on both, e-mails in any case; the
// collector gathers; and a replica restarted with its snapshot directory
// is ready without reading either table, the writes made while it was
// down included.
func TestTwoReplicas(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dirA := t.TempDir()

	// The orders table locked: replica a's follower of it cannot read it.
	lock, err := e.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.ExecContext(ctx, "LOCK TABLES "+e.orders+" WRITE"); err != nil {
		t.Fatal(err)
	}
	a := e.start(t, "a", dirA)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := readyz(t, a.svc)
		if !strings.HasPrefix(got, "503") || !strings.Contains(got, e.orders+": follower") {
			t.Fatalf("/readyz with orders locked = %q, want 503 naming %s", got, e.orders)
		}
		if !strings.Contains(got, e.customers) {
			t.Logf("/readyz with orders locked, customers followed: %q", got)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("customers not followed within 30 s: %q", got)
		}
	}
	if a.svc.Ready() {
		t.Fatal("Ready with orders locked")
	}
	lock.ExecContext(ctx, "UNLOCK TABLES")
	lock.Close()

	b := e.start(t, "b", "")
	if a.orders.f.Stats().ServerID == b.orders.f.Stats().ServerID {
		t.Fatalf("replicas a and b share server id %d", a.orders.f.Stats().ServerID)
	}

	halt := e.startOtherWriter(t, ctx)
	waitReady(t, a, b)
	waitReadyz(t, a, b)

	// Writes through replica a, read at once on replica b under their
	// tokens.
	const n = 200
	before := b.orders.Loader().Stats()
	behind, _ := e.writeThrough(t, ctx, a, b, n)
	after := b.orders.Loader().Stats()
	t.Logf("%d orders and %d customers inserted through a, read on b under their tokens: %d would have read absent on b without the token; %d token lookups waited, %d passed through",
		n, n, behind, after.TokenWaits-before.TokenWaits, after.TokenPassed-before.TokenPassed)
	if p := after.TokenPassed - before.TokenPassed; p != 0 {
		t.Errorf("%d lookups under a token passed through after waiting 10 s", p)
	}
	halt()

	checked := e.checkKeys(t, a, b)
	t.Logf("%d lookups of committed keys on 2 replicas, 0 may read absent", checked)
	if st := a.orders.f.Stats(); st.Skipped == 0 {
		t.Errorf("a's follower of orders skipped none of its own %d inserts: %+v", n, st)
	} else {
		t.Logf("a's follower of orders skipped %d own inserts (tagged), applied %d changes", st.Skipped, st.Applied)
	}
	// The e-mails went in mixed case; the Loader holds them in the
	// column's one text, and so does their tag: skipped, not a second copy.
	if st := a.customers.f.Stats(); st.Skipped < int64(n) {
		t.Errorf("a's follower of customers skipped %d of its own %d mixed-case inserts: %+v", st.Skipped, n, st)
	}

	// The collectors gather, pedantically, what the followers say: a's
	// first reads were for a snapshot file not there yet, b's for its
	// first session (no directory).
	for _, c := range []struct {
		r      *replica
		reason string
	}{{a, "snapshot_missing"}, {b, "start"}} {
		reg := prometheus.NewPedanticRegistry()
		if err := reg.Register(c.r.svc); err != nil {
			t.Fatal(err)
		}
		if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
			t.Errorf("lint: %v %v", problems, err)
		}
		for _, table := range []string{e.orders, e.customers} {
			for name, want := range map[string]float64{
				`cuckooguard_follower_full_reads_total{reason="` + c.reason + `",table="` + table + `"}`: 1,
				`cuckooguard_follower_full_reads_total{reason="other",table="` + table + `"}`:            0,
				`cuckooguard_loader_ready{table="` + table + `"}`:                                        1,
			} {
				if got := sample(t, reg, name); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			var states float64
			for _, st := range []string{"pass-through", "resyncing", "following", "behind"} {
				states += sample(t, reg, `cuckooguard_follower_state{state="`+st+`",table="`+table+`"}`)
			}
			if states != 1 {
				t.Errorf("the state gauges of %s add up to %v, want 1", table, states)
			}
		}
	}

	// a and b stop; another client writes while they are down; a starts
	// again from its snapshot directory.
	if err := a.svc.Close(); err != nil {
		t.Fatal(err)
	}
	b.svc.Close()
	for _, name := range []string{e.orders, e.customers} {
		if _, err := os.Stat(filepath.Join(dirA, snapshotName(e.service, name))); err != nil {
			t.Fatalf("no snapshot file of %s: %v", name, err)
		}
	}
	for i := range 50 {
		e.db.ExecContext(ctx, "INSERT INTO "+e.orders+" VALUES (?, 'while down')", 700_000+i)
		e.db.ExecContext(ctx, "INSERT INTO "+e.customers+" VALUES (?, 'while down')", fmt.Sprintf("Down%d@Example.com", i))
	}
	a2 := e.start(t, "a", dirA)
	checked = e.checkKeys(t, a2)
	t.Logf("restarted from the snapshot directory: %d lookups of committed keys, 0 may read absent", checked)
	for _, f := range []mysql.Stats{a2.orders.f.Stats(), a2.customers.f.Stats()} {
		if f.FullReads != 0 || f.Restores != 1 {
			t.Errorf("restarted replica: %d reads of a table, %d restores (%s); want 0 and 1", f.FullReads, f.Restores, f.ReadReason)
		}
	}
	if a2.orders.f.Stats().ServerID != a.orders.f.Stats().ServerID {
		t.Error("the restarted replica took another server id")
	}
}

// sample returns the value of the sample name{labels} (labels sorted as
// the registry writes them) that g gathers, or -1 if there is none.
func sample(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			if mf.GetName()+"{"+strings.Join(labels, ",")+"}" != name {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestTeardown: Teardown drops the heartbeat tables of the service's
// tables, and nothing of another service's.
func TestTeardown(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	r := e.start(t, "a", "")
	waitReady(t, r)
	r.svc.Close()
	other := HeartbeatTable("another service", e.orders)
	if _, err := e.db.ExecContext(ctx, "CREATE TABLE `"+other+"` (id INT UNSIGNED NOT NULL PRIMARY KEY) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	defer e.db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+other+"`")
	count := func() (mine, others int) {
		for _, name := range column[string](t, e.db, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()") {
			switch name {
			case HeartbeatTable(e.service, e.orders), HeartbeatTable(e.service, e.customers):
				mine++
			case other:
				others++
			}
		}
		return mine, others
	}
	if mine, _ := count(); mine != 2 {
		t.Fatalf("%d heartbeat tables of the service before Teardown, want 2", mine)
	}
	if err := Teardown(ctx, e.db, Config{Service: e.service}, e.orders, e.customers); err != nil {
		t.Fatal(err)
	}
	if mine, others := count(); mine != 0 || others != 1 {
		t.Fatalf("after Teardown: %d heartbeat tables of the service, %d of another; want 0 and 1", mine, others)
	}
}

// TestStartRefuses: what Start cannot work with is an error, not a
// half-started service. The cases before a table's row estimate need no
// server.
func TestStartRefuses(t *testing.T) {
	db, err := sql.Open("mysql", "u@127.0.0.1:1/db") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	get := func(context.Context, int64) (order, error) { return order{}, nil }
	dsn := "u@tcp(127.0.0.1:1)/db"
	for _, c := range []struct {
		name   string
		cfg    Config
		tables []Guarded
	}{
		{"no pool", Config{DSN: dsn, Service: "x"}, []Guarded{&Table[int64, order]{Name: "orders", Column: "id", Get: get}}},
		{"no DSN", Config{DB: db, Service: "x"}, []Guarded{&Table[int64, order]{Name: "orders", Column: "id", Get: get}}},
		{"no service", Config{DB: db, DSN: dsn}, []Guarded{&Table[int64, order]{Name: "orders", Column: "id", Get: get}}},
		{"no table", Config{DB: db, DSN: dsn, Service: "x"}, nil},
		{"no column", Config{DB: db, DSN: dsn, Service: "x"}, []Guarded{&Table[int64, order]{Name: "orders", Get: get}}},
		{"a table twice", Config{DB: db, DSN: dsn, Service: "x"}, []Guarded{&Table[int64, order]{Name: "orders", Column: "id", Get: get}, &Table[int64, order]{Name: "orders", Column: "id", Get: get}}},
		{"no Get", Config{DB: db, DSN: dsn, Service: "x"}, []Guarded{&Table[int64, order]{Name: "orders", Column: "id", Capacity: 10}}},
		{"a key type without a Parse", Config{DB: db, DSN: dsn, Service: "x"}, []Guarded{&Table[[16]byte, order]{Name: "orders", Column: "id",
			Get: func(context.Context, [16]byte) (order, error) { return order{}, nil }}}},
		{"a DSN the follower cannot read", Config{DB: db, DSN: "u@127.0.0.1/db", Service: "x"}, []Guarded{&Table[int64, order]{Name: "orders", Column: "id", Capacity: 10, Get: get}}},
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
	if _, err := Start(context.Background(), Config{DB: db, DSN: dsn, Service: "x"}, nilTable); err == nil {
		t.Fatal("a nil table: no error")
	}
}

// TestStartNoSuchTable: a table the pool's database lacks is an error of
// Start (its row estimate).
func TestStartNoSuchTable(t *testing.T) {
	e := newEnv(t)
	_, err := Start(context.Background(), Config{DB: e.db, DSN: e.dsn, Service: e.service},
		&Table[int64, order]{Name: "nowhere_" + e.orders, Column: "id", Get: func(context.Context, int64) (order, error) { return order{}, nil }})
	if err == nil || !strings.Contains(err.Error(), "no table nowhere_") {
		t.Fatalf("Start of a missing table: %v", err)
	}
}

// TestServerID: a replica's ids are the same at every start, in
// [2^31, 2^32), and another for each service, replica and table.
func TestServerID(t *testing.T) {
	seen := map[uint32]string{}
	for _, svc := range []string{"orders-api", "users-api"} {
		for _, origin := range []string{"pod-0", "pod-1", "pod-2"} {
			for _, table := range []string{"orders", "users"} {
				id := ServerID(svc, origin, table)
				if id != ServerID(svc, origin, table) || id < 1<<31 {
					t.Fatalf("ServerID(%s, %s, %s) = %d", svc, origin, table, id)
				}
				name := svc + "/" + origin + "/" + table
				if other, dup := seen[id]; dup {
					t.Fatalf("%s and %s share server id %d", name, other, id)
				}
				seen[id] = name
			}
		}
	}
	// The names are kept apart: "ab"+"c" is not "a"+"bc".
	if ServerID("ab", "c", "t") == ServerID("a", "bc", "t") || HeartbeatTable("ab", "c") == HeartbeatTable("a", "bc") {
		t.Fatal("names run together")
	}
	if hb := HeartbeatTable("orders-api", "orders"); len(hb) != len("cuckooguard_hb_")+16 || !strings.HasPrefix(hb, "cuckooguard_hb_") {
		t.Fatalf("HeartbeatTable = %q", hb)
	}
	if got := snapshotName("orders api", "shop.orders"); got != "orders_api.shop_orders.guard" {
		t.Fatalf("snapshotName = %q", got)
	}
}

// startOtherWriter starts another client that writes until the returned
// halt: new orders, deleted seed orders, new customers in mixed case.
func (e *env) startOtherWriter(t *testing.T, ctx context.Context) (halt func()) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tx, err := e.db.BeginTx(ctx, nil)
			if err != nil {
				t.Error(err)
				return
			}
			tx.ExecContext(ctx, "INSERT INTO "+e.orders+" VALUES (?, 'other'), (?, 'other')", 100_000+2*i, 100_001+2*i)
			if i < 400 {
				tx.ExecContext(ctx, "DELETE FROM "+e.orders+" WHERE id = ?", 1+i)
			}
			tx.ExecContext(ctx, "INSERT INTO "+e.customers+" VALUES (?, 'other')", fmt.Sprintf("Other%d@Example.COM", i))
			if err := tx.Commit(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	return func() {
		close(stop)
		wg.Wait()
	}
}

// waitReadyz waits until each replica's /readyz says 200.
func waitReadyz(t *testing.T, replicas ...*replica) {
	t.Helper()
	for i, r := range replicas {
		// Ready just now; a heartbeat late on a loaded machine may lapse
		// the lease for moments, so the 200 is waited for.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			got := readyz(t, r.svc)
			if got == "200 ready" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: /readyz = %q", i, got)
			}
		}
	}

}

// writeThrough inserts n orders and n customers (in mixed case) through
// replica a, each looked up at once on b under its token, then deletes 50
// seed orders through a. It returns how many of the orders b's guard
// alone would have answered absent, and the last customer's token.
func (e *env) writeThrough(t *testing.T, ctx context.Context, a, b *replica, n int) (behind int, tok guarded.Token) {
	t.Helper()
	for i := range n {
		id := int64(500_000 + i)
		var err error
		tok, err = a.orders.Insert(ctx, id, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO "+e.orders+" VALUES (?, 'through a')", id)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if tok.IsZero() {
			t.Fatal("Insert returned no token with gtid_strict_mode on")
		}
		if !b.orders.Loader().MayContain(id) {
			behind++
		}
		if !b.orders.Loader().MayContainContext(guarded.WithToken(ctx, tok), id) {
			t.Errorf("order %d, inserted through a (token %v), reads absent on b under its token", id, tok)
		}
		if !a.orders.Loader().MayContain(id) {
			t.Errorf("order %d, inserted through a, reads absent on a", id)
		}
		email := fmt.Sprintf("Token%d@Example.com", i) // not the column's one text: tagged in it (Table.Key)
		tok, err = a.customers.Insert(ctx, email, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO "+e.customers+" VALUES (?, 'through a')", email)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if !b.customers.Loader().MayContainContext(guarded.WithToken(ctx, tok), strings.ToLower(email)) {
			t.Errorf("customer %q, inserted through a (token %v), reads absent on b under its token", email, tok)
		}
	}
	for i := range 50 {
		id := int64(900 + i)
		tok, err := a.orders.Delete(ctx, id, func(ctx context.Context, tx *sql.Tx) (bool, error) {
			res, err := tx.ExecContext(ctx, "DELETE FROM "+e.orders+" WHERE id = ?", id)
			if err != nil {
				return false, err
			}
			rows, err := res.RowsAffected()
			return rows == 1, err
		})
		if err != nil || tok.IsZero() {
			t.Fatalf("Delete(%d) = %v, %v", id, tok, err)
		}
	}
	return behind, tok
}
