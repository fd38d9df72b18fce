package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// replicaRole makes a login role with REPLICATION that may read users in
// dsn's schema and nothing more (no CREATE, no ownership), and returns a
// DSN of it.
func replicaRole(t *testing.T, dsn string, grants ...string) string {
	t.Helper()
	return testRole(t, dsn, "cg_replica_", append([]string{
		`CREATE ROLE $role LOGIN REPLICATION`,
		`GRANT USAGE ON SCHEMA $schema TO $role`,
		`GRANT SELECT ON users TO $role`,
	}, grants...)...)
}

// testRole runs stmts on dsn with $role replaced by a role name made of
// prefix and dsn's schema (the first statement creates it) and $schema by
// that schema, drops the role and what it owns when t ends, and returns a
// DSN of the role.
func testRole(t *testing.T, dsn, prefix string, stmts ...string) string {
	t.Helper()
	ctx := context.Background()
	c := connect(t, dsn)
	var schema, user string
	if err := c.QueryRow(ctx, `SELECT current_schema(), current_user`).Scan(&schema, &user); err != nil {
		t.Fatal(err)
	}
	role := prefix + schema
	for _, q := range stmts {
		q = strings.NewReplacer("$role", role, "$schema", schema).Replace(q)
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		c.Exec(ctx, fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE %s`, role, role))
	})
	return strings.Replace(dsn, user+"@", role+"@", 1)
}

// TestPublishLeastPrivilege is the first week's permission finding: a
// replica's role, which owns nothing and may create nothing, calls
// Publish at start-up where everything is in place already, and follows.
// Publish writes nothing then; the follower notes its slot only where it
// may, and follows either way.
func TestPublishLeastPrivilege(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 1000)
	for i, tc := range []struct {
		name   string
		grants []string
		noted  bool
	}{
		{"no write on cuckooguard_slots", nil, false},
		{"SELECT, INSERT and UPDATE on cuckooguard_slots", []string{`GRANT SELECT, INSERT, UPDATE ON cuckooguard_slots TO $role`}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replica := replicaRole(t, dsn, tc.grants...)
			if err := Publish(ctx, connect(t, replica), "users", "id"); err != nil {
				t.Fatalf("Publish as the replica's role, with everything in place: %v", err)
			}
			var log syncBuffer
			n := startNode(t, dsn, "users", "id", "R", parseInt64, nodeConf{followDSN: replica,
				opts: []Option{WithLogger(slog.New(slog.NewTextHandler(&log, nil)))}})
			insertRange(t, dsn, 5000+100*i, 5100+100*i)
			expectNoWrong404s(t, n, "followed by the replica's role")
			slots, err := Slots(ctx, connect(t, dsn), "users")
			if err != nil {
				t.Fatal(err)
			}
			noted := len(slots) == 1 && !slots[0].LastSeen.IsZero()
			said := strings.Count(log.String(), "cannot note its slot")
			if noted != tc.noted || said != map[bool]int{true: 0, false: 1}[tc.noted] {
				t.Fatalf("slots %+v, said %d times that it cannot note its slot; want noted %v", slots, said, tc.noted)
			}
			n.halt()
			if err := Unpublish(ctx, connect(t, dsn), "users"); err != nil {
				t.Fatal(err)
			}
			if err := Publish(ctx, connect(t, dsn), "users", "id"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPublishWrongKeySaysWhy is the first week's message finding: a
// table guarded by a column that is not its primary key (users by
// e-mail) is refused for what it is, not as "logical decoding is not
// available".
func TestPublishWrongKeySaysWhy(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	execAll(t, dsnOf(t, db), `CREATE TABLE subscribers (id bigint PRIMARY KEY, email text UNIQUE NOT NULL)`)
	err := Publish(ctx, db, "subscribers", "email")
	switch {
	case !errors.Is(err, ErrKeyNotIdentity) || errors.Is(err, ErrLogicalUnavailable):
		t.Fatalf("Publish by a unique non-key column = %v, want ErrKeyNotIdentity (and not ErrLogicalUnavailable)", err)
	case !strings.Contains(err.Error(), "REPLICA IDENTITY USING INDEX") || !strings.Contains(err.Error(), "(id), not (email)"):
		t.Fatalf("Publish by a unique non-key column = %v: want the replica identity named, and the fix", err)
	}
	t.Logf("Publish(subscribers, email): %v", err)
}

// TestUnpublishRemovesEverything: Unpublish leaves nothing that Publish
// or the followers made: no publication, no slot, and no cuckooguard_slots
// once no other table's followers use it. WithRegistry puts that table in
// a schema of its own.
func TestUnpublishRemovesEverything(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 100)
	c := connect(t, dsn)
	var schema string
	if err := c.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	ops := schema + "_ops"
	execAll(t, dsn, `CREATE SCHEMA `+ops, `CREATE TABLE other (id bigint PRIMARY KEY, name text)`)
	t.Cleanup(func() { execAll(t, dsn, `DROP SCHEMA `+ops+` CASCADE`) })
	reg := WithRegistry(ops)
	for _, table := range []string{"users", "other"} {
		if err := Publish(ctx, c, table, "id", reg); err != nil {
			t.Fatal(err)
		}
	}
	a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{opts: []Option{reg}})
	b := startNode(t, dsn, "other", "id", "B", parseInt64, nodeConf{opts: []Option{reg}})
	for _, tc := range []struct{ table, slot string }{{"users", slotName(schema, "users", "A")}, {"other", slotName(schema, "other", "B")}} {
		slots, err := Slots(ctx, c, tc.table, reg)
		if err != nil || len(slots) != 1 || slots[0].Name != tc.slot || slots[0].LastSeen.IsZero() {
			t.Fatalf("Slots(%s) = %+v, %v: want %s, noted in %s", tc.table, slots, err, tc.slot, ops)
		}
	}
	a.halt()
	b.halt()
	count := func(q string, args ...any) (n int) {
		t.Helper()
		if err := c.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i, table := range []string{"users", "other"} {
		if err := Unpublish(ctx, c, table, reg); err != nil {
			t.Fatal(err)
		}
		pubs := count(`SELECT count(*) FROM pg_publication WHERE pubname = $1`, publicationName(schema, table))
		slots := count(`SELECT count(*) FROM pg_replication_slots WHERE starts_with(slot_name::text, $1)`, slotPrefix(schema, table))
		registries := count(`SELECT count(*) FROM pg_tables WHERE tablename = $1 AND schemaname = $2`, registry, ops)
		if want := 1 - i; pubs != 0 || slots != 0 || registries != want {
			t.Fatalf("after Unpublish(%s): %d publications, %d slots, %d cuckooguard_slots; want 0, 0, %d", table, pubs, slots, registries, want)
		}
	}
}
