package postgres

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgConn connects to CUCKOOGUARD_PG_DSN with search_path set to a fresh
// schema, which is dropped at the end; it skips the test without a DSN.
func pgConn(t *testing.T) (*pgx.Conn, func() *pgx.Conn) {
	t.Helper()
	dsn := os.Getenv("CUCKOOGUARD_PG_DSN")
	if dsn == "" {
		t.Skip("set CUCKOOGUARD_PG_DSN=postgres://user@127.0.0.1:5432/db to run against PostgreSQL (.ci/run starts one)")
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(t.Name()))
	schema := fmt.Sprintf("cg_%s_%d", name, time.Now().UnixNano()%1e9)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	var conns []*pgx.Conn
	open := func() *pgx.Conn {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["search_path"] = schema
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		return c
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close(ctx)
		}
		admin.Close(ctx)
		// A fresh connection: a test may have restarted the server.
		admin, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer admin.Close(ctx)
		// Slots and publications belong to the database, not the schema:
		// the followers' permanent slots would hold WAL on the server.
		dropFollowerState(ctx, t, admin, schema)
		admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	})
	return open(), open
}

// next waits for the next notification on conn and decodes it.
func next(t *testing.T, conn *pgx.Conn) Change {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("WaitForNotification: %v", err)
	}
	c, err := ParseChange(n.Payload)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestInstallPublishesChanges(t *testing.T) {
	ctx := context.Background()
	db, open := pgConn(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT)`)
	if err := Install(ctx, db, "users", "id"); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, db, "users", "id"); err != nil {
		t.Fatalf("second Install: %v", err)
	}
	l := open()
	if _, err := l.Exec(ctx, "LISTEN "+pgx.Identifier{Channel("users")}.Sanitize()); err != nil {
		t.Fatal(err)
	}

	exec(`INSERT INTO users VALUES ('a b', 'x')`)
	exec(`UPDATE users SET name = 'y' WHERE id = 'a b'`) // not the key: no notification
	exec(`UPDATE users SET id = 'c' WHERE id = 'a b'`)
	exec(`DELETE FROM users WHERE id = 'c'`)
	exec(`INSERT INTO users VALUES ($1, 'long')`, strings.Repeat("k", 9000))
	// Insert, delete and insert the same key in one transaction: three
	// notifications, not two (identical payloads would be merged).
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`INSERT INTO users VALUES ('d', '')`, `DELETE FROM users WHERE id = 'd'`, `INSERT INTO users VALUES ('d', '')`} {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	want := []Change{
		{Op: Insert, Key: "a b"},
		{Op: Update, OldKey: "a b", Key: "c"},
		{Op: Delete, Key: "c"},
		{Op: Resync},
		{Op: Insert, Key: "d"}, {Op: Delete, Key: "d"}, {Op: Insert, Key: "d"},
	}
	var seq int64
	for i, w := range want {
		c := next(t, l)
		if c.Op != w.Op || c.Key != w.Key || c.OldKey != w.OldKey || c.TxID == 0 || c.Seq <= seq {
			t.Fatalf("notification %d = %+v, want %+v (in order, increasing seq)", i, c, w)
		}
		seq = c.Seq
	}
}

// TestInstallConcurrentAndIdle runs Install from several connections at
// once on a fresh table (a rolling deploy: every replica installs at
// start-up), then again while a transaction holds a write lock on the
// table: the concurrent installs must all succeed (CREATE OR REPLACE
// FUNCTION races fail with "tuple concurrently updated" without the
// advisory lock), and an install that finds the trigger in place must not
// wait for the table's lock (DROP TRIGGER would).
func TestInstallConcurrentAndIdle(t *testing.T) {
	ctx := context.Background()
	db, open := pgConn(t)
	if _, err := db.Exec(ctx, `CREATE TABLE users (id BIGINT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	conns := make([]*pgx.Conn, 8)
	for i := range conns {
		conns[i] = open()
	}
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { errs[i] = Install(ctx, c, "users", "id") })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Install %d: %v", i, err)
		}
	}
	var triggers int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'users'::regclass AND NOT tgisinternal`).Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if triggers != 1 {
		t.Fatalf("%d triggers on users after 8 concurrent installs, want 1", triggers)
	}

	writer := open()
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO users VALUES (1)`); err != nil { // holds ROW EXCLUSIVE on users
		t.Fatal(err)
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := Install(ictx, db, "users", "id"); err != nil {
		t.Fatalf("Install of an installed trigger while a write is open: %v after %v", err, time.Since(start))
	}
	t.Logf("re-install next to an open write: %v", time.Since(start))
}

// TestSnapshotDeduplicatesWarmUp checks the rule a follower relies on: a
// notification whose transaction is visible in the warm-up read's snapshot
// was seen by the read, every other one was not.
func TestSnapshotDeduplicatesWarmUp(t *testing.T) {
	ctx := context.Background()
	db, open := pgConn(t)
	if _, err := db.Exec(ctx, `CREATE TABLE items (id BIGINT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, db, "items", "id"); err != nil {
		t.Fatal(err)
	}
	l := open()
	if _, err := l.Exec(ctx, "LISTEN "+pgx.Identifier{Channel("items")}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	w2 := open()
	if _, err := db.Exec(ctx, `INSERT INTO items VALUES (1)`); err != nil { // before the read
		t.Fatal(err)
	}
	inFlight, err := w2.Begin(ctx) // in progress when the read starts
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inFlight.Exec(ctx, `INSERT INTO items VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	reader := open()
	rtx, sn, err := ReadSnapshot(ctx, reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := inFlight.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO items VALUES (3)`); err != nil { // after the read began
		t.Fatal(err)
	}
	seen := map[string]bool{}
	rows, err := rtx.Query(ctx, `SELECT id::text FROM items`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		seen[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rtx.Rollback(ctx)
	for range 3 {
		c := next(t, l)
		if got := sn.Visible(c.TxID); got != seen[c.Key] {
			t.Fatalf("key %s: snapshot %+v says visible=%v for txid %d, the read saw it: %v", c.Key, sn, got, c.TxID, seen[c.Key])
		}
	}
	if !seen["1"] || seen["2"] || seen["3"] {
		t.Fatalf("the read saw %v, want only 1", seen)
	}
}

// dropFollowerState drops the replication slots and publications of the
// tables of schema that followers made (once the followers are stopped).
func dropFollowerState(ctx context.Context, t *testing.T, admin *pgx.Conn, schema string) {
	t.Helper()
	rows, err := admin.Query(ctx, `SELECT tablename::text FROM pg_tables WHERE schemaname = $1`, schema)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	for _, rel := range tables {
		if rel == registry {
			continue // Unpublish of the last followed table drops it
		}
		if err := Unpublish(ctx, admin, schema+"."+rel); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		var left int
		admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE starts_with(slot_name::text, $1)`, slotPrefix(schema, rel)).Scan(&left)
		if left > 0 {
			t.Errorf("cleanup: %d replication slots of %s.%s left on the server", left, schema, rel)
		}
	}
}
