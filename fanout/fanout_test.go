package fanout

import (
	"context"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/postgres"
	"github.com/jackc/pgx/v5"
)

// TestRelay runs a relay of two tables and three followers of one of
// them: other processes' writes and the followers' own tagged inserts
// (one with a second row in its transaction) reach every follower, each
// checked key by key; the database has one slot and one walsender for
// them all; and a new follower starts from a saved guard without reading
// the table.
func TestRelay(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.table(t, "users", 1000)
	e.table(t, "orders", 10)
	r, _ := e.startRelay(t, "r_"+t.Name(), "users", "orders")
	var nodes []*node
	for _, id := range []string{"a", "b", "c"} {
		// The relay's replica saves its guard: here all three share one
		// relay, so a alone does. (Several saving the same table at once
		// is correct, but a new replica that reads a guard while another
		// save replaces it may find its chunks gone, and read the table.)
		when := r.Leading
		if id != "a" {
			when = nil
		}
		nodes = append(nodes, e.startNode(t, id, "users", WithSnapshots(e.bucket(), 100*time.Millisecond, when)))
	}
	e.exec(t, `INSERT INTO users SELECT g, 'other' FROM generate_series(2000, 2999) g`,
		`DELETE FROM users WHERE id <= 100`, `UPDATE users SET id = id + 100000 WHERE id BETWEEN 101 AND 110`,
		`INSERT INTO orders VALUES (100, 'o')`)
	nodes[0].insert(t, 5000, 5001)
	err := nodes[1].loader.Insert(ctx, 6000, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, nodes[1].pool, func(tx pgx.Tx) error {
			if err := nodes[1].f.Tag(ctx, postgres.ExecIn(tx), 6000); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO users VALUES (6000, 'b'), (6001, 'second row')`)
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		expectNoWrong404s(t, n, "after other processes' and own writes")
	}
	if sk := nodes[1].f.Stats().Skipped; sk < 1 {
		t.Errorf("b skipped %d own inserts", sk)
	}
	var walsenders, slots int
	c, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name LIKE 'cuckooguard relay stream r_'||$1`, t.Name()).Scan(&walsenders)
	c.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, relaySlot("r_"+t.Name())).Scan(&slots)
	if walsenders != 1 || slots != 1 {
		t.Fatalf("%d walsenders and %d slots for the relay, want 1 and 1", walsenders, slots)
	}
	// A saved guard: a new replica starts from it, and reads no table.
	for deadline := time.Now().Add(10 * time.Second); nodes[0].f.Stats().SnapshotsSaved+nodes[1].f.Stats().SnapshotsSaved+nodes[2].f.Stats().SnapshotsSaved == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no follower saved its guard")
		}
	}
	d := e.startNode(t, "d", "users")
	if st := d.f.Stats(); st.SnapshotStarts != 1 || len(st.Reads) != 0 {
		t.Fatalf("the new replica: %+v; want a start from the saved guard, and no read", st)
	}
	e.exec(t, `INSERT INTO users SELECT g, 'later' FROM generate_series(3000, 3099) g`)
	expectNoWrong404s(t, d, "started from the saved guard")
	t.Logf("relay: %+v", r.Stats())
}
