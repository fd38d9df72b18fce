package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// connect opens a connection to dsn for the test.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// tableIDs returns every id of the users table.
func tableIDs(t *testing.T, dsn string) []int64 {
	t.Helper()
	ctx := context.Background()
	c := connect(t, dsn)
	rows, err := c.Query(ctx, `SELECT id FROM users`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// agrees waits until r follows and its guard holds every key of the table
// (a scan), and returns how many copies its guard holds beyond the rows
// (false positives: inserts both read and replayed, untagged own inserts).
func agrees(t *testing.T, r *replica, dsn string) int {
	t.Helper()
	// Deletions wait for a heartbeat whose snapshot sees them (apply.go),
	// and the snapshot of the heartbeat that comes back may not be known
	// yet when it does (its statement's answer races its message through
	// the stream): the second heartbeat back releases them.
	r.waitCurrent(t)
	r.waitCurrent(t)
	ids := tableIDs(t, dsn)
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for !r.loader.MayContain(id) {
			if time.Now().After(deadline) {
				t.Fatalf("replica %s never learned of id %d: %+v", r.id, id, r.follower.Stats())
			}
			time.Sleep(time.Millisecond)
		}
	}
	return r.loader.Guard().Len() - len(ids)
}

// execAll runs each statement on a connection of its own, untagged: another
// process's writes.
func execAll(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
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

// TestLogicalChanges follows the users table through logical decoding
// while its own Loader and other processes write: inserts, a key update,
// deletes, this process's tagged inserts (skipped: its Loader added them)
// and an untagged one (applied: one extra copy), then a TRUNCATE, after
// which only a full read can drop the keys that are gone.
func TestLogicalChanges(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 100)
	a := startReplica(t, dsn, "A")
	if st := a.follower.Stats(); st.Resyncs != 1 || st.FullReads[ReadStart] != 1 {
		t.Fatalf("first session: %+v, want one full read for start", st)
	}
	for id := int64(1000); id < 1010; id++ {
		if err := a.insert(ctx, id); err != nil { // tagged: skipped
			t.Fatal(err)
		}
	}
	// Untagged, through the Loader: added, and applied again.
	if err := a.loader.Insert(ctx, 2000, func(ctx context.Context) error {
		_, err := a.pool.Exec(ctx, `INSERT INTO users VALUES (2000, 'untagged')`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	execAll(t, dsn,
		`INSERT INTO users SELECT g, 'other' FROM generate_series(3000, 3049) g`,
		`UPDATE users SET id = 4000 WHERE id = 5`,
		`UPDATE users SET name = 'renamed' WHERE id = 6`, // the key stays
		`DELETE FROM users WHERE id BETWEEN 10 AND 19`,
	)
	if err := a.delete(ctx, 1000); err != nil { // its own delete: from the stream
		t.Fatal(err)
	}
	extra := agrees(t, a, dsn)
	st := a.follower.Stats()
	t.Logf("after the changes: %d extra copies; %+v", extra, st)
	if st.Skipped < 10 {
		t.Fatalf("%d own inserts skipped, want 10", st.Skipped)
	}
	if extra != 1 { // the untagged insert
		t.Fatalf("%d copies beyond the rows, want 1 (the untagged insert): a delete or the key update was not applied, or an own insert was applied", extra)
	}
	execAll(t, dsn, `TRUNCATE users`, `INSERT INTO users SELECT g, 'after' FROM generate_series(1, 20) g`)
	deadline := time.Now().Add(30 * time.Second)
	for a.follower.Stats().FullReads[ReadTruncated] == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no full read after TRUNCATE: %+v", a.follower.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if extra := agrees(t, a, dsn); extra != 0 {
		t.Fatalf("%d copies beyond the 20 rows after TRUNCATE and a full read", extra)
	}
}

// TestLogicalSetup: what logical decoding needs is checked, and each
// missing piece is named.
func TestLogicalSetup(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	for _, q := range []string{
		`CREATE TABLE nokey (id bigint, name text)`,
		`CREATE TABLE otherkey (id bigint, uid bigint PRIMARY KEY)`,
		`CREATE TABLE full_ident (id bigint PRIMARY KEY, name text)`,
		`ALTER TABLE full_ident REPLICA IDENTITY FULL`,
		`CREATE TABLE byindex (uid bigint PRIMARY KEY, id bigint NOT NULL)`,
		`CREATE UNIQUE INDEX byindex_id ON byindex (id)`,
		`ALTER TABLE byindex REPLICA IDENTITY USING INDEX byindex_id`,
		`CREATE TABLE users (id bigint PRIMARY KEY, name text)`,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(q, err)
		}
	}
	for _, tc := range []struct{ table, want string }{
		{"nokey", "no primary key"},
		{"otherkey", "its replica identity is (uid), not (id)"},
		{"full_ident", "REPLICA IDENTITY FULL"},
	} {
		err := Publish(ctx, db, tc.table, "id")
		if !errors.Is(err, ErrKeyNotIdentity) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Publish(%s) = %v, want ErrKeyNotIdentity saying %q", tc.table, err, tc.want)
		}
	}
	if err := Publish(ctx, db, "byindex", "id"); err != nil {
		t.Errorf("Publish of a table whose replica identity is a unique index of the key: %v", err)
	}
	if err := Publish(ctx, db, "byindex", "id"); err != nil {
		t.Errorf("Publish again: %v", err)
	}

	var schema string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := db.Config()
	dsn := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&search_path=%s", cfg.User, cfg.Host, cfg.Port, cfg.Database, schema)
	run := func(dsn string) error {
		l := emptyLoader(t)
		defer l.Close()
		f, err := NewFollower(l, dsn, "users", "id", parseID, WithHeartbeat(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return f.Run(rctx)
	}
	if err := run(dsn); !errors.Is(err, ErrNotPublished) {
		t.Errorf("Run on a table that is not published = %v, want ErrNotPublished", err)
	}
	// A user without the REPLICATION attribute.
	role := "cg_norepl_" + schema
	if _, err := db.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN NOREPLICATION; GRANT USAGE, CREATE ON SCHEMA %s TO %s; GRANT SELECT ON users TO %s`, role, schema, role, role)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin, _ := pgConn(t)
		admin.Exec(ctx, fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE %s`, role, role))
	})
	if err := Publish(ctx, db, "users", "id"); err != nil {
		t.Fatal(err)
	}
	err := run(strings.Replace(dsn, cfg.User+"@", role+"@", 1))
	if !errors.Is(err, ErrLogicalUnavailable) || !strings.Contains(err.Error(), "REPLICATION") {
		t.Errorf("Run as a user without REPLICATION = %v, want ErrLogicalUnavailable naming it", err)
	}
}

// TestLogicalRestartFromSnapshot is the restart of the logical-decoding
// issue: a process saves its guard with its position when Run returns,
// the table changes while it is down (other processes' inserts, deletes
// and a key update, and an insert its previous run tagged), and the
// restarted process starts from the file and the changes since, without
// reading the table. Then every reason to fall back to a full read: a
// missing, corrupt, foreign or stale file, and a slot that is gone.
func TestLogicalRestartFromSnapshot(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 1000)
	file := filepath.Join(t.TempDir(), "users.guard")
	opts := []Option{WithSnapshotFile(file), WithHeartbeat(50 * time.Millisecond)}

	// start runs replica A with opts (and more) and waits until it
	// follows.
	start := func(more ...Option) *replica {
		return startReplicaVia(t, dsn, dsn, "A", append(append([]Option(nil), opts...), more...)...)
	}
	a := start()
	if st := a.follower.Stats(); st.FullReads[ReadNoSnapshot] != 1 {
		t.Fatalf("first start: %+v, want a full read for a missing snapshot", st)
	}
	for id := int64(5000); id < 5020; id++ {
		if err := a.insert(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	execAll(t, dsn, `INSERT INTO users SELECT g, 'b' FROM generate_series(6000, 6019) g`)
	agrees(t, a, dsn)
	oldRun := a.follower // its tag is the previous run's
	a.halt()
	if st := oldRun.Stats(); st.Snapshots == 0 {
		t.Fatalf("no snapshot written when Run returned: %+v", st)
	}
	// While A is down.
	execAll(t, dsn,
		`INSERT INTO users SELECT g, 'down' FROM generate_series(7000, 7049) g`,
		`DELETE FROM users WHERE id BETWEEN 1 AND 100`,
		`UPDATE users SET id = 8000 WHERE id = 500`,
	)
	if err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		if err := oldRun.Tag(ctx, tx, 9000); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO users VALUES (9000, 'tagged by the previous run')`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	b := start()
	st := b.follower.Stats()
	t.Logf("restarted from the file and following in %v: %+v", time.Since(restarted), st)
	if st.SnapshotStart != 1 || st.Resyncs != 0 {
		t.Fatalf("restart read the table: %+v, want a start from the snapshot file", st)
	}
	if extra := agrees(t, b, dsn); extra < 0 {
		t.Fatalf("%d copies fewer than rows", -extra)
	}

	fallback := func(name string, why ReadReason, prepare func()) {
		t.Run(name, func(t *testing.T) {
			b.halt()
			prepare()
			r := start()
			st := r.follower.Stats()
			if st.FullReads[why] != 1 || st.SnapshotStart != 0 {
				t.Fatalf("start: %+v, want one full read for %q", st, why)
			}
			agrees(t, r, dsn)
			r.halt()
			b = r
		})
	}
	fallback("missing", ReadNoSnapshot, func() { os.Remove(file) })
	fallback("corrupt", ReadBadSnapshot, func() {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/2] ^= 0xff
		os.WriteFile(file, data, 0o644)
	})
	fallback("truncated", ReadBadSnapshot, func() {
		data, _ := os.ReadFile(file)
		os.WriteFile(file, data[:len(data)/3], 0o644)
	})
	fallback("not a snapshot", ReadBadSnapshot, func() { os.WriteFile(file, []byte("hello"), 0o644) })
	fallback("slot gone", ReadSlotMissing, func() {
		c := connect(t, dsn)
		schema, rel, err := splitTable(ctx, c, "users")
		if err != nil {
			t.Fatal(err)
		}
		if err := dropSlot(ctx, c, slotName(schema, rel, "A")); err != nil {
			t.Fatal(err)
		}
	})
	fallback("stale", ReadStaleSnapshot, func() {
		// An older file: the slot has confirmed a later position since,
		// one that a later file held.
		older, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		h, g, err := readSnapshotFile(file)
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
		r := start(WithSnapshotInterval(10 * time.Millisecond))
		execAll(t, dsn, `INSERT INTO users SELECT g, 'later' FROM generate_series(10000, 10099) g`)
		agrees(t, r, dsn)
		for deadline := time.Now().Add(30 * time.Second); r.follower.Stats().ConfirmedLSN <= h.lsn; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the slot never confirmed past the older file's %s: %+v", h.lsn, r.follower.Stats())
			}
		}
		r.halt()
		os.WriteFile(file, older, 0o644)
	})
}
