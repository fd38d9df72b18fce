package postgres

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guard"
)

// The tests in this file are the six ways to a wrong 404 that the follower
// issue found from outside, and its follow-on findings: each writes
// through another client, waits until the replica says it follows with
// those writes, and checks every committed key.

// hb is the heartbeat of the nodes of these tests (startNode), and bound
// the staleness a 404 may have: the heartbeat deadline.
const (
	hb    = 50 * time.Millisecond
	bound = 3 * hb
)

func parseInt64(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
func parseText(s string) (string, error) { return s, nil }

// publication returns the name of the publication of users in dsn's schema.
func publication(t *testing.T, dsn string) string {
	t.Helper()
	schema, rel, err := splitTable(context.Background(), connect(t, dsn), "users")
	if err != nil {
		t.Fatal(err)
	}
	return pgx.Identifier{publicationName(schema, rel)}.Sanitize()
}

// insertRange commits the rows from..to-1 of users in one transaction of
// another process.
func insertRange(t *testing.T, dsn string, from, to int) {
	t.Helper()
	execAll(t, dsn, fmt.Sprintf(`INSERT INTO users SELECT g, 'other' FROM generate_series(%d, %d) g`, from, to-1))
}

// cappedGuard returns guard options whose memory cap is too small for the
// keys of the tests: shards refuse keys and pass their lookups through.
func cappedGuard(t *testing.T) []guard.Option {
	t.Helper()
	g, err := guard.New(guard.WithCapacity(1000), guard.WithShards(2))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	return []guard.Option{guard.WithCapacity(1000), guard.WithShards(2), guard.WithMaxBytes(g.Stats().Bytes + 1000)}
}

// Case 1: a guard degraded by a full shard (its shards pass lookups
// through) is saved to the snapshot file, which has no room for the
// pass-through marks, and a restart installs it with every mark cleared.
func TestWrong404DegradedGuardSaved(t *testing.T) {
	dsn := setupUsers(t, 3000)
	file := filepath.Join(t.TempDir(), "users.guard")
	conf := nodeConf{guard: cappedGuard(t), opts: []Option{WithSnapshotFile(file), WithSnapshotInterval(10 * time.Millisecond)}}
	a := startNode(t, dsn, "users", "id", "A", parseInt64, conf)
	if a.loader.Stats().PassThroughShards == 0 {
		t.Fatal("the memory cap did not bite: no shard passes through")
	}
	insertRange(t, dsn, 5000, 5100)
	expectNoWrong404s(t, a, "degraded, following")
	a.halt()
	b := startNode(t, dsn, "users", "id", "A", parseInt64, conf)
	expectNoWrong404s(t, b, "restarted")
}

// Case 2: a publication whose table has a row filter, or that does not
// publish inserts, sends the stream only part of the changes.
func TestWrong404PublicationFilters(t *testing.T) {
	for _, tc := range []struct{ name, with, fix string }{
		{"row filter", `SET TABLE users (id) WHERE (id < 10000)`, `SET TABLE users (id)`},
		{"operations", `SET (publish = 'update, delete, truncate')`, `SET (publish = 'insert, update, delete, truncate')`},
	} {
		t.Run(tc.name+"/at start", func(t *testing.T) {
			ctx := context.Background()
			dsn := setupUsers(t, 100)
			execAll(t, dsn, `ALTER PUBLICATION `+publication(t, dsn)+` `+tc.with)
			err := Publish(ctx, connect(t, dsn), "users", "id")
			t.Logf("Publish over the altered publication: %v", err)
			if !errors.Is(err, ErrNotPublished) {
				t.Errorf("Publish = %v, want ErrNotPublished", err)
			}
			a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{noWait: true})
			for end := time.Now().Add(3 * time.Second); !a.following() && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
			}
			insertRange(t, dsn, 10000, 10100)
			if stayHonest(t, a, bound, time.Second) {
				expectNoWrong404s(t, a, "started on the altered publication")
			}
			if err := a.halt(); !errors.Is(err, ErrNotPublished) {
				t.Errorf("Run = %v, want ErrNotPublished", err)
			}
		})
		t.Run(tc.name+"/while following", func(t *testing.T) {
			dsn := setupUsers(t, 100)
			a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{})
			execAll(t, dsn, `ALTER PUBLICATION `+publication(t, dsn)+` `+tc.with)
			insertRange(t, dsn, 10000, 10100)
			stayHonest(t, a, bound, time.Second)
			execAll(t, dsn, `ALTER PUBLICATION `+publication(t, dsn)+` `+tc.fix)
			insertRange(t, dsn, 20000, 20100)
			expectNoWrong404s(t, a, "after the publication was mended")
		})
	}
}

// Case 3: the table dropped from the publication while replicas run, and
// added again: the changes in between never reach the stream.
func TestWrong404TableDroppedFromPublication(t *testing.T) {
	dsn := setupUsers(t, 1000)
	a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{})
	pub := publication(t, dsn)
	execAll(t, dsn, `ALTER PUBLICATION `+pub+` DROP TABLE users`)
	insertRange(t, dsn, 10000, 10100)
	stayHonest(t, a, bound, time.Second)
	execAll(t, dsn, `ALTER PUBLICATION `+pub+` ADD TABLE users (id)`)
	insertRange(t, dsn, 20000, 20100)
	expectNoWrong404s(t, a, "after the table was added again")
}

// Case 4: a tagged transaction that inserts more rows than the key its
// Loader added: a second row, and a row a trigger writes.
func TestWrong404TagCoversOneKey(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 10)
	execAll(t, dsn, `CREATE FUNCTION shadow_row() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.id BETWEEN 8000 AND 8999 THEN
				INSERT INTO users VALUES (NEW.id + 100000, 'by the trigger');
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER shadow AFTER INSERT ON users FOR EACH ROW EXECUTE FUNCTION shadow_row()`)
	a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{})
	insert := func(id int64, extra string) {
		t.Helper()
		err := a.loader.Insert(ctx, id, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
				if err := a.follower.Tag(ctx, tx, id); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO users VALUES ($1, 'A')`, id); err != nil {
					return err
				}
				if extra != "" {
					_, err := tx.Exec(ctx, extra)
					return err
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	insert(7000, `INSERT INTO users VALUES (7001, 'same transaction')`)
	insert(8000, "")
	expectNoWrong404s(t, a, "tagged transactions with a second row")
	if st := a.follower.Stats(); st.Skipped != 2 {
		t.Errorf("%d inserts skipped, want 2 (7000 and 8000)", st.Skipped)
	}
}

// Case 5: between the decision to resume and START_REPLICATION the slot
// is dropped and made again (another process with the same origin, or an
// operator), with rows committed in between: the server forwards the
// start to the new slot's position, past them.
func TestWrong404SlotMovedBeforeStart(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 1000)
	a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{})
	var once sync.Once
	var moved atomic.Bool
	c := connect(t, dsn)
	testHookBeforeStart = func(slot string) {
		once.Do(func() {
			for _, q := range []string{`SELECT pg_drop_replication_slot($1)`,
				`INSERT INTO users SELECT g, 'while the slot was away' FROM generate_series(10000, 10099) g WHERE $1 <> ''`} {
				if _, err := c.Exec(ctx, q, slot); err != nil {
					t.Error(err)
					return
				}
			}
			if _, err := c.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
				t.Error(err)
				return
			}
			moved.Store(true)
		})
	}
	t.Cleanup(func() { testHookBeforeStart = nil })
	execAll(t, dsn, fmt.Sprintf(`SELECT pg_terminate_backend(%d)`, a.follower.Stats().BackendPID))
	for !moved.Load() {
		time.Sleep(time.Millisecond)
	}
	expectNoWrong404s(t, a, "after the slot moved before the stream started")
}

// Case 6: keys whose ::text differs from their type's output: the read
// and the stream must produce the same text.
func TestWrong404KeyTextForms(t *testing.T) {
	for _, tc := range []struct {
		typ         string
		seed, later []string
	}{
		{"char(5)", []string{"ab", "cde", "f"}, []string{"gh", "ijk", "l"}},
		{"inet", []string{"10.0.0.1", "10.0.0.2/32", "10.1.0.0/16"}, []string{"10.0.0.3", "192.168.1.1/32", "::1"}},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			ctx := context.Background()
			db, _ := pgConn(t)
			dsn := dsnOf(t, db)
			execAll(t, dsn, `CREATE TABLE keyed (k `+tc.typ+` PRIMARY KEY)`)
			for _, k := range tc.seed {
				execAll(t, dsn, `INSERT INTO keyed VALUES (`+quoteLiteral(k)+`)`)
			}
			if err := Publish(ctx, db, "keyed", "k"); err != nil {
				t.Fatal(err)
			}
			a := startNode(t, dsn, "keyed", "k", "A", parseText, nodeConf{})
			for _, k := range tc.later {
				execAll(t, dsn, `INSERT INTO keyed VALUES (`+quoteLiteral(k)+`)`)
			}
			expectNoWrong404s(t, a, tc.typ+" keys, read and streamed")
		})
	}
}

// dsnOf returns a DSN of db's server, database and search path.
func dsnOf(t *testing.T, db *pgx.Conn) string {
	t.Helper()
	var schema string
	if err := db.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := db.Config()
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&search_path=%s", cfg.User, cfg.Host, cfg.Port, cfg.Database, schema)
}

// Case 6, the settings: a role whose defaults print values otherwise
// (DateStyle, TimeZone, IntervalStyle, bytea_output, extra_float_digits)
// reads and streams keys in one text form. The read sets the forms for its
// own transaction, not as startup parameters, which a pooler refuses
// (TestFollowerThroughTransactionPooler).
func TestWrong404KeyTextFormsUnderRoleDefaults(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	styled := testRole(t, dsn, "cg_style_",
		`CREATE ROLE $role LOGIN SUPERUSER`,
		`ALTER ROLE $role SET DateStyle = 'SQL, DMY'`,
		`ALTER ROLE $role SET TimeZone = 'Asia/Kolkata'`,
		`ALTER ROLE $role SET IntervalStyle = 'sql_standard'`,
		`ALTER ROLE $role SET bytea_output = 'escape'`,
		`ALTER ROLE $role SET extra_float_digits = 0`,
	)
	sdb := connect(t, styled)
	var got string
	if err := sdb.QueryRow(ctx, `SELECT '2026-01-02 03:04:05+00'::timestamptz::text`).Scan(&got); err != nil || got == "2026-01-02 03:04:05+00" {
		t.Fatalf("the role's defaults are not in effect (%q, %v): the test would prove nothing", got, err)
	}
	for _, tc := range []struct {
		typ         string
		seed, later []string
	}{
		{"timestamptz", []string{"2026-01-02 03:04:05+00", "2026-12-31 23:59:59.5+02"}, []string{"2027-02-03 04:05:06+00", "1999-01-08 12:00:00-08"}},
		{"timestamp", []string{"2026-01-02 03:04:05"}, []string{"2027-02-03 04:05:06"}},
		{"date", []string{"2026-01-02"}, []string{"2027-02-03"}},
		{"interval", []string{"1 day 02:00:00", "3 mons"}, []string{"2 days 00:00:01", "1 year"}},
		{"bytea", []string{`\x0102ff`, `\x41`}, []string{`\x00ff`, `\x7f80`}},
		{"float8", []string{"0.3333333333333333", "1e-7"}, []string{"0.6666666666666666", "2.718281828459045"}},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			table := "styled_" + strings.TrimSuffix(tc.typ, "8")
			execAll(t, styled, `CREATE TABLE `+table+` (k `+tc.typ+` PRIMARY KEY)`)
			for _, k := range tc.seed {
				execAll(t, styled, `INSERT INTO `+table+` VALUES (`+quoteLiteral(k)+`)`)
			}
			if err := Publish(ctx, sdb, table, "k"); err != nil {
				t.Fatal(err)
			}
			a := startNode(t, styled, table, "k", "A", parseText, nodeConf{})
			for _, k := range tc.later {
				execAll(t, styled, `INSERT INTO `+table+` VALUES (`+quoteLiteral(k)+`)`)
			}
			expectNoWrong404s(t, a, tc.typ+" keys under the role's output defaults, read and streamed")
		})
	}
}
