package fanout

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// TestReadSeesWhatTheStreamCarries commits a row under synchronous
// replication to a standby that never answers: the commit is decoded (and
// could be published) while the row is invisible. A new replica that reads
// the table meanwhile must still end up with the row once it is visible.
func TestReadSeesWhatTheStreamCarries(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.table(t, "users", 100)
	e.startRelay(t, "r_sync", "users")
	a := e.startNode(t, "a", "users")
	admin, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// Every session commits without waiting for a standby, but the one
	// that asks for it, which waits for one that never comes.
	for _, q := range []string{`ALTER SYSTEM SET synchronous_commit = 'local'`, `SELECT pg_reload_conf()`,
		`ALTER SYSTEM SET synchronous_standby_names = 'cg_nobody'`, `SELECT pg_reload_conf()`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		e.exec(t, `ALTER SYSTEM RESET synchronous_standby_names`, `ALTER SYSTEM RESET synchronous_commit`, `SELECT pg_reload_conf()`)
	})
	time.Sleep(200 * time.Millisecond) // the reload reaches every backend
	waiter, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close(ctx)
	committed := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, `SET synchronous_commit = on; INSERT INTO users VALUES (999999, 'waits for a standby')`)
		committed <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting bool
		admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep')`, waiter.PgConn().PID()).Scan(&waiting)
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the insert never waited for the standby")
		}
	}
	time.Sleep(300 * time.Millisecond) // the relay decodes the commit
	b := e.newNode(t, e.nc, "b", "users")
	for deadline := time.Now().Add(10 * time.Second); b.f.Stats().Reads[readStart] == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("b never read the table: %+v", b.f.Stats())
		}
	}
	// The commit ends its wait (a cancelled wait for a standby leaves the
	// transaction committed): the row is visible from now on.
	if _, err := admin.Exec(ctx, `SELECT pg_cancel_backend($1)`, waiter.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err != nil {
		t.Logf("the waiting insert: %v", err)
	}
	var visible bool
	admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM users WHERE id = 999999)`).Scan(&visible)
	if !visible {
		t.Fatal("the row that waited for the standby is not visible after the wait ended")
	}
	for _, n := range []*node{a, b} {
		expectNoWrong404s(t, n, "after a commit that waited for a standby")
	}
}

// otherDatabase makes a second database with the test's schema, for
// tests of two databases on one NATS server, and returns its env (the
// same stream, prefix and bucket).
func (e *env) otherDatabase(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	name := "cg_fanout_db_" + e.id
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	o := &env{dsn: u.String(), nc: e.nc, opts: e.opts, id: e.id}
	schema := u.Query().Get("search_path")
	o.exec(t, "CREATE SCHEMA "+schema)
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, e.dsn)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close(ctx)
		for _, r := range o.relays {
			c.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND database = $2 AND active`, relaySlot(r), name)
		}
		time.Sleep(100 * time.Millisecond)
		c.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
		if _, err := c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return o
}

// TestTwoDatabases runs a relay of the same table (schema and name) in
// two databases of one cluster on one NATS server and stream: each replica
// follows its own database's rows only.
func TestTwoDatabases(t *testing.T) {
	e := newEnv(t)
	o := e.otherDatabase(t)
	e.table(t, "users", 100)
	o.exec(t, `CREATE TABLE users (id bigint PRIMARY KEY, name text NOT NULL)`, `INSERT INTO users SELECT g, 'b' FROM generate_series(5001, 5050) g`)
	c, err := pgx.Connect(context.Background(), o.dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Publish(context.Background(), c, "users", "id"); err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background())
	o.tables = append(o.tables, "users")
	e.startRelay(t, "r_two_a", "users")
	o.startRelay(t, "r_two_b", "users")
	a := e.startNode(t, "a", "users")
	b := o.startNode(t, "b", "users")
	// Transactions of both, one after the other: neither replica may take
	// the other's for its own (read the table again, skip them as old).
	for i := range 50 {
		e.exec(t, fmt.Sprintf(`INSERT INTO users VALUES (%d, 'a')`, 1001+i))
		o.exec(t, fmt.Sprintf(`INSERT INTO users VALUES (%d, 'b')`, 6001+i))
	}
	expectNoWrong404s(t, a, "database A")
	expectNoWrong404s(t, b, "database B")
	for _, n := range []*node{a, b} {
		if st := n.f.Stats(); len(st.Reads) != 1 || st.Reads[readStart] != 1 {
			t.Errorf("%s read its table for %v: another database's messages are not its own", n.id, st.Reads)
		}
	}
	// A relay of the second database under the first one's name would
	// take the first one's slot, whose name is the cluster's: it refuses.
	r, err := NewRelay(relayed(t, o.dsn), "r_two_a", e.nc, tablesOf("users"), o.opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := r.Run(ctx); !errors.Is(err, postgres.ErrSlotOfAnotherDatabase) {
		t.Errorf("a relay named as another database's: Run = %v, want ErrSlotOfAnotherDatabase", err)
	} else {
		t.Logf("a relay named as another database's: %v", err)
	}
}

// TestForeignMessageRefused puts, on a replica's subject, a message that
// says it comes from another database (a misconfigured relay, a subject
// collision): the replica refuses it, and passes through, rather than
// apply what it says.
func TestForeignMessageRefused(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 100)
	r, _ := e.startRelay(t, "r_foreign", "users")
	a := e.startNode(t, "a", "users")
	var db postgres.Database
	var table string
	func() {
		c, err := pgx.Connect(context.Background(), e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		if db, err = postgres.IdentifyDatabase(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		if table, err = postgres.Resolve(context.Background(), c, "users"); err != nil {
			t.Fatal(err)
		}
	}()
	subject := route{db: db.Origin(), relay: Token("r_foreign"), table: Token(table)}.subject("cg" + e.id)
	foreign := txMsg{Epoch: "x", DB: "1_1", Term: r.Stats().Term + 1, LSN: 1 << 62, Prev: 1, Deletes: []string{"1", "2", "3"}}
	b, _ := foreign.encode()
	if _, err := e.jsOf(t).Publish(context.Background(), subject+".tx", b); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(fmt.Sprint(a.f.Stats().LastError), "refused"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a message of another database was not refused: %+v", a.f.Stats())
		}
	}
	for _, id := range []int64{1, 2, 3} {
		if !a.loader.MayContain(id) && a.loader.Ready() {
			t.Errorf("key %d reads absent after a foreign message deleted it", id)
		}
	}
	t.Logf("refused: %v", a.f.Stats().LastError)
}

// TestBigTransactions commits what the old relay could not publish: a
// 30,000-row insert through a Loader, tagged, and 6,000 text keys that
// JSON escapes to six times their length. The relay passes both on and
// the replicas follow.
func TestBigTransactions(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.table(t, "users", 10)
	e.exec(t, `CREATE TABLE notes (id text PRIMARY KEY)`)
	c, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Publish(ctx, c, "notes", "id"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	e.tables = append(e.tables, "notes")
	r, _ := e.startRelayWith(t, "r_big", tablesOf("users", "notes"), nil)
	a := e.startNode(t, "a", "users")
	b := e.startNode(t, "b", "users")
	// 30,000 generated keys, added by a's Loader and tagged in one
	// transaction.
	err = a.loader.InsertGenerated(ctx, func(ctx context.Context, add func(int64) error) error {
		return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `INSERT INTO users SELECT g, 'bulk' FROM generate_series(100000, 129999) g RETURNING id`)
			if err != nil {
				return err
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return err
			}
			for _, id := range ids {
				if err := add(id); err != nil {
					return err
				}
			}
			return a.f.Tag(ctx, postgres.ExecIn(tx), ids...)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	expectNoWrong404s(t, a, "after a tagged 30,000-row insert")
	expectNoWrong404s(t, b, "after another replica's 30,000-row insert")
	if sk := a.f.Stats().Skipped; sk < 30000 {
		t.Errorf("a skipped %d of its own 30,000 inserts: the tags did not reach it whole", sk)
	}
	// 6,000 text keys of "<", escaped by JSON to six bytes each.
	g, err := guard.New(guard.WithCapacity(10_000))
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[string, string](func(ctx context.Context, k string) (string, error) { return k, nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := NewFollower(l, e.nc, relayed(t, e.dsn), "notes", "id", func(s string) (string, error) { return s, nil },
		append([]Option{WithRelay("r_big"), WithHeartbeat(50 * time.Millisecond), WithLogger(testLogger(t))}, e.opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	defer func() { cancel(); <-done }()
	e.exec(t, `INSERT INTO notes SELECT repeat('<', 80) || g FROM generate_series(1, 6000) g`)
	since := time.Now()
	for deadline := since.Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st := f.Stats(); st.State == postgres.Following && st.CurrentAsOf.After(since) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower of the text keys never followed past the insert: %+v; relay %+v", f.Stats(), r.Stats())
		}
	}
	missing := 0
	for i := 1; i <= 6000; i++ {
		if !l.MayContain(strings.Repeat("<", 80) + fmt.Sprint(i)) {
			missing++
		}
	}
	// The previous release's relay failed session after session here
	// ("maximum payload exceeded"), and never got past the transaction.
	if st := r.Stats(); missing > 0 || strings.Contains(fmt.Sprint(st.Source.LastError), "payload") {
		t.Errorf("%d of 6,000 escaped keys absent; relay: %+v", missing, st)
	}
	t.Logf("relay: %+v", r.Stats())
}

// TestShortMaxAge runs a relay whose stream keeps messages for 5 s,
// shorter than JetStream's default duplicate window: the stream is made,
// and the replicas follow.
func TestShortMaxAge(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 100)
	e.startRelayWith(t, "r_short", tablesOf("users"), []Option{WithMaxAge(5 * time.Second)})
	a := e.startNode(t, "a", "users")
	e.exec(t, `INSERT INTO users SELECT g, 'x' FROM generate_series(1000, 1099) g`)
	expectNoWrong404s(t, a, "with a 5 s max age")
}

// TestStreamRefused asks for a stream the broker cannot make (three
// replicas on a server that is not clustered): Run returns the broker's
// refusal instead of trying forever.
func TestStreamRefused(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 10)
	r, err := NewRelay(relayed(t, e.dsn), "r_refused", e.nc, tablesOf("users"), append(e.opts, WithStreamReplicas(3), WithHeartbeat(50*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	e.relays = append(e.relays, "r_refused")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, errStreamRefused) {
			t.Errorf("Run = %v, want the broker's refusal", err)
		}
		t.Logf("Run: %v", err)
	case <-time.After(15 * time.Second):
		cancel()
		<-done
		t.Fatalf("Run did not return the broker's refusal within 15 s: %+v", r.Stats())
	}
}

// TestTwoRelaysOneTable runs two services, each with a relay of its own
// name, relaying the same table on the same stream: each service's
// replica follows its own relay, and neither reads the table again and
// again.
func TestTwoRelaysOneTable(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 2000)
	e.startRelay(t, "svc_a", "users")
	a := e.startNode(t, "a", "users", WithRelay("svc_a"))
	e.startRelay(t, "svc_b", "users")
	b := e.startNode(t, "b", "users", WithRelay("svc_b"))
	l := startLoad(t, e, []*node{a, b}, staleBound)
	time.Sleep(3 * time.Second)
	l.halt()
	for _, n := range []*node{a, b} {
		st := n.f.Stats()
		reads := int64(0)
		for _, r := range st.Reads {
			reads += r
		}
		t.Logf("%s: %d reads of the table: %+v", n.id, reads, st)
		if reads > 1 {
			t.Errorf("%s read the table %d times in 3 s: %v", n.id, reads, st.Reads)
		}
		expectNoWrong404s(t, n, "two relays of one table")
	}
}

// TestRunReturnsPromptly ends the contexts of a relay and a follower
// whose stream was deleted and whose NATS connection then goes nowhere (a
// broker that hangs): both Run return within a second.
func TestRunReturnsPromptly(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 10)
	p, nc := natsViaProxy(t)
	r, err := NewRelay(relayed(t, e.dsn), "r_prompt", nc, tablesOf("users"), append(e.opts, WithHeartbeat(50*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	e.relays = append(e.relays, "r_prompt")
	ctx, cancel := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(ctx) }()
	a := e.startNodeOn(t, nc, "a", "users", WithRelay("r_prompt"))
	fctx, fcancel := context.WithCancel(context.Background())
	followerDone := make(chan error, 1)
	g, _ := guard.New(guard.WithCapacity(100))
	l, _ := guarded.New(g, guarded.GetterFunc[int64, string](func(ctx context.Context, k int64) (string, error) { return "", nil }))
	defer l.Close()
	f, err := NewFollower(l, nc, relayed(t, e.dsn), "users", "id", a.f.parse, append([]Option{WithRelay("r_prompt")}, e.opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	go func() { followerDone <- f.Run(fctx) }()
	time.Sleep(500 * time.Millisecond)
	if err := e.jsOf(t).DeleteStream(context.Background(), "CG_"+e.id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	p.Stall()
	time.Sleep(500 * time.Millisecond)
	begin := time.Now()
	cancel()
	fcancel()
	a.stop()
	for name, done := range map[string]chan error{"Relay.Run": relayDone, "Follower.Run": followerDone} {
		select {
		case err := <-done:
			t.Logf("%s returned %v after %v", name, err, time.Since(begin).Round(time.Millisecond))
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not return within 5 s of its context's end, with the broker hanging", name)
		}
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("Run returned %v after its context ended, want about a second at most", took)
	}
	p.Resume()
}
