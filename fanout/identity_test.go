package fanout

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/postgres"
)

// followAgainWithin is how soon after a fault's end every replica must
// follow again.
const followAgainWithin = 5 * time.Second

// faultRun is one fault run on two replicas that follow users through a
// relay, all with the default settings (follower heartbeat 100 ms and max
// lag 150 ms, relay heartbeat 500 ms), while another process commits a
// row every millisecond and checkers read recent rows through both.
type faultRun struct {
	e     *env
	nodes []*node
	load  *load
}

// startFaultRun starts a fault run of a users table of seed rows, whose
// relay is named name, and waits until both replicas follow.
func startFaultRun(t *testing.T, name string, seed int) *faultRun {
	t.Helper()
	e := newEnv(t)
	e.table(t, "users", seed)
	e.startRelayWith(t, name, tablesOf("users"), []Option{WithHeartbeat(DefaultRelayHeartbeat)})
	defaults := []Option{WithHeartbeat(DefaultHeartbeat), WithMaxLag(DefaultMaxLag)}
	fr := &faultRun{e: e, nodes: []*node{e.startNode(t, "a", "users", defaults...), e.startNode(t, "b", "users", defaults...)}}
	fr.load = startLoad(t, e, fr.nodes, staleBound)
	time.Sleep(500 * time.Millisecond)
	return fr
}

// followAgain waits until every replica follows with the changes
// committed after end, the fault's end, and fails the test if one took
// longer than followAgainWithin; it returns how long the slowest took.
func (fr *faultRun) followAgain(t *testing.T, what string, end time.Time) time.Duration {
	t.Helper()
	var slowest time.Duration
	for _, n := range fr.nodes {
		for deadline := end.Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			st := n.f.Stats()
			if st.State == postgres.Following && n.loader.Ready() && st.CurrentAsOf.After(end) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s: %s does not follow again 30 s after the fault's end: %+v", t.Name(), what, n.id, st)
			}
		}
		slowest = max(slowest, time.Since(end))
	}
	if slowest > followAgainWithin {
		t.Errorf("%s: the replicas followed again %v after the fault's end, want within %v", what, slowest.Round(time.Millisecond), followAgainWithin)
	}
	return slowest
}

// finish lets the checkers run for another half second, stops the load,
// logs what it measured and checks every committed key on every replica.
func (fr *faultRun) finish(t *testing.T, what string) {
	t.Helper()
	time.Sleep(500 * time.Millisecond)
	fr.load.halt()
	reads := map[string]int64{}
	failures := map[string]int64{}
	for _, n := range fr.nodes {
		st := n.f.Stats()
		for k, v := range st.Reads {
			reads[k] += v
		}
		for k, v := range st.Failures {
			failures[k] += v
		}
	}
	t.Logf("%s: %d Gets, %d while passing through, %d wrong 404s; reads %v, failed sessions %v",
		what, fr.load.gets.Load(), fr.load.passing.Load(), fr.load.wrong.Load(), reads, failures)
	for _, n := range fr.nodes {
		expectNoWrong404s(t, n, what)
	}
}

// republish publishes table again after its name came to name another
// table (a rename swap, a DROP and CREATE), as an operator would, and
// logs how: postgres.Publish, or, where it refuses because the
// publication of the name holds the old table or none, a DROP PUBLICATION
// and Publish again.
func (e *env) republish(t *testing.T, table string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	err = postgres.Publish(ctx, c, table, "id")
	if errors.Is(err, postgres.ErrNotPublished) {
		t.Logf("postgres.Publish refuses (%v): the publication is dropped by hand and made again", err)
		var schema string
		if err := c.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			t.Fatal(err)
		}
		pub := pgx.Identifier{"cuckooguard_" + schema + "_" + table}.Sanitize()
		if _, err := c.Exec(ctx, "DROP PUBLICATION "+pub); err != nil {
			t.Fatal(err)
		}
		err = postgres.Publish(ctx, c, table, "id")
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestTableIdentityThroughRelay changes, under two replicas that follow
// users through a relay, which table the name users names, or what its
// publication sends: a rename swap in one transaction, a DROP and CREATE
// in one transaction, and the table taken out of its publication and put
// back. The first heartbeat after each ends "following"; once the name's
// table is published (the fault's end) both replicas read it and follow
// again within 5 s; no row committed 300 ms or more before a lookup ever
// reads absent on a replica that says it follows.
func TestTableIdentityThroughRelay(t *testing.T) {
	cases := []struct {
		name  string
		fault func(t *testing.T, e *env) // returns at the fault's end
	}{
		{"rename swap", func(t *testing.T, e *env) {
			e.exec(t, `CREATE TABLE users_new (LIKE users INCLUDING ALL)`,
				`INSERT INTO users_new SELECT g, 'new' FROM generate_series(2000001, 2000200) g`,
				`BEGIN; ALTER TABLE users RENAME TO users_old; ALTER TABLE users_new RENAME TO users; COMMIT`)
			time.Sleep(time.Second) // the rows committed meanwhile are in the table the name names, and in no stream
			e.republish(t, "users")
		}},
		{"DROP and CREATE", func(t *testing.T, e *env) {
			e.exec(t, `BEGIN; DROP TABLE users; CREATE TABLE users (id bigint PRIMARY KEY, name text NOT NULL);
				INSERT INTO users SELECT g, 'again' FROM generate_series(1, 100) g; COMMIT`)
			time.Sleep(time.Second)
			e.republish(t, "users")
		}},
		{"publication drop and re-add", func(t *testing.T, e *env) {
			var schema string
			c, err := pgx.Connect(context.Background(), e.dsn)
			if err != nil {
				t.Fatal(err)
			}
			err = c.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&schema)
			c.Close(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			pub := pgx.Identifier{"cuckooguard_" + schema + "_users"}.Sanitize()
			e.exec(t, "ALTER PUBLICATION "+pub+" DROP TABLE users")
			time.Sleep(time.Second) // rows committed now are in no stream
			e.exec(t, "ALTER PUBLICATION "+pub+" ADD TABLE users (id)")
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fr := startFaultRun(t, fmt.Sprintf("r_ident%d", i), 500)
			c.fault(t, fr.e)
			end := time.Now()
			following := fr.followAgain(t, c.name, end)
			t.Logf("%s: following again %v after the fault's end", c.name, following.Round(time.Millisecond))
			fr.finish(t, c.name)
		})
	}
}
