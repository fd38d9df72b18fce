package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The scenario suite of the follower issue: what a table goes through in
// production, each scenario written through other clients, waited for
// until the replica says it follows with every change, and checked key by
// key. Each logs the keys it checked and the wrong 404s it found.

// writer commits rows of users through a connection of its own (another
// process), one at a time, and now and then deletes one, until stopped.
type writer struct {
	stop  context.CancelFunc
	wg    sync.WaitGroup
	n     atomic.Int64 // rows committed
	errs  atomic.Int64 // statements whose outcome is unknown (a restarted server, say)
	pause time.Duration
}

func startWriter(t *testing.T, dsn string, from int64, pause time.Duration) *writer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{stop: cancel, pause: pause}
	w.wg.Go(func() {
		rng := rand.New(rand.NewPCG(uint64(from), 1))
		var c *pgx.Conn
		defer func() {
			if c != nil {
				c.Close(context.Background())
			}
		}()
		for id := from; ctx.Err() == nil; id++ {
			if c == nil || c.IsClosed() {
				var err error
				if c, err = pgx.Connect(ctx, dsn); err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
			}
			q, arg := `INSERT INTO users VALUES ($1, 'writer')`, id
			if rng.IntN(10) == 0 && id > from+10 {
				q, arg = `DELETE FROM users WHERE id = $1`, from+rng.Int64N(id-from)
			}
			if _, err := c.Exec(ctx, q, arg); err != nil {
				w.errs.Add(1)
				continue
			}
			w.n.Add(1)
			time.Sleep(w.pause)
		}
	})
	return w
}

func (w *writer) halt() {
	w.stop()
	w.wg.Wait()
}

// TestScenarios runs the scenarios on one users table each, followed by a
// node with a heartbeat of 50 ms.
func TestScenarios(t *testing.T) {
	ctx := context.Background()
	// A scenario's follower connects with dsn and the parameters in
	// params (server settings for its sessions, the walsender's included).
	scenario := func(name, params string, run func(t *testing.T, dsn string, a *node[int64])) {
		t.Run(name, func(t *testing.T) {
			dsn := setupUsers(t, 1000)
			// A deadline that lets the walsender decode the large
			// transactions (issue 32: the follower that tells a busy
			// walsender from a dead one by itself).
			a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{followDSN: dsn + params, opts: []Option{WithHeartbeatDeadline(10 * time.Second)}})
			run(t, dsn, a)
			expectNoWrong404s(t, a, name)
		})
	}
	scenario("savepoints", "", func(t *testing.T, dsn string, a *node[int64]) {
		execAll(t, dsn, `BEGIN; INSERT INTO users VALUES (10001, 'kept');
			SAVEPOINT s; INSERT INTO users VALUES (10002, 'rolled back'); DELETE FROM users WHERE id = 1; ROLLBACK TO s;
			SAVEPOINT t; INSERT INTO users VALUES (10003, 'kept'); RELEASE t;
			DELETE FROM users WHERE id = 2; COMMIT`)
	})
	scenario("key updates", "", func(t *testing.T, dsn string, a *node[int64]) {
		execAll(t, dsn, `UPDATE users SET id = id + 100000 WHERE id <= 100`,
			`UPDATE users SET id = -id WHERE id BETWEEN 101 AND 200`,
			`UPDATE users SET id = id + 1 WHERE id = 1000`)
	})
	// Transactions bigger than the walsender's logical_decoding_work_mem
	// spill to disk on the server; aborted ones must leave no trace.
	scenario("large and aborted transactions", "&logical_decoding_work_mem=64kB", func(t *testing.T, dsn string, a *node[int64]) {
		execAll(t, dsn,
			`INSERT INTO users SELECT g, 'large' FROM generate_series(100000, 199999) g`,
			`BEGIN; INSERT INTO users SELECT g, 'aborted' FROM generate_series(200000, 249999) g; DELETE FROM users WHERE id < 500; ROLLBACK`,
			`BEGIN; DELETE FROM users WHERE id BETWEEN 100000 AND 149999; INSERT INTO users SELECT g, 'again' FROM generate_series(100000, 109999) g; COMMIT`)
	})
	scenario("two-phase commit", "", func(t *testing.T, dsn string, a *node[int64]) {
		var prepared int
		if err := connect(t, dsn).QueryRow(ctx, `SELECT current_setting('max_prepared_transactions')::int`).Scan(&prepared); err != nil {
			t.Fatal(err)
		}
		if prepared == 0 {
			t.Skip("max_prepared_transactions is 0 on this server (.ci/run sets it)")
		}
		gid := fmt.Sprintf("cg_%d", time.Now().UnixNano())
		// The NOTIFY trigger of setupUsers would forbid PREPARE.
		execAll(t, dsn, `ALTER TABLE users DISABLE TRIGGER USER`)
		execAll(t, dsn, `BEGIN; INSERT INTO users SELECT g, '2pc' FROM generate_series(20000, 20099) g; PREPARE TRANSACTION '`+gid+`'`)
		insertRange(t, dsn, 21000, 21010)
		a.waitCurrent(t) // the prepared rows are not committed: nothing to find yet
		execAll(t, dsn, `COMMIT PREPARED '`+gid+`'`,
			`BEGIN; INSERT INTO users VALUES (22000, 'rolled back'); PREPARE TRANSACTION '`+gid+`b'`,
			`ROLLBACK PREPARED '`+gid+`b'`)
	})
	scenario("walsender killed under writers", "", func(t *testing.T, dsn string, a *node[int64]) {
		w := startWriter(t, dsn, 1_000_000, time.Millisecond)
		defer w.halt()
		for range 5 {
			time.Sleep(200 * time.Millisecond)
			if pid := a.follower.Stats().BackendPID; pid != 0 {
				execAll(t, dsn, fmt.Sprintf(`SELECT pg_terminate_backend(%d)`, pid))
			}
			a.waitCurrent(t)
		}
		w.halt()
		if st := a.follower.Stats(); st.Failures < 5 || st.Resyncs != 1 {
			t.Errorf("after 5 kills: %d failures, %d full reads; want 5 or more, and only the first read (resumes)", st.Failures, st.Resyncs)
		}
		t.Logf("%d rows written meanwhile", w.n.Load())
	})
	file := filepath.Join(t.TempDir(), "users.guard")
	t.Run("restarts from the file while writing", func(t *testing.T) {
		dsn := setupUsers(t, 1000)
		conf := nodeConf{opts: []Option{WithSnapshotFile(file), WithSnapshotInterval(100 * time.Millisecond)}}
		w := startWriter(t, dsn, 1_000_000, time.Millisecond)
		defer w.halt()
		checked, wrong := 0, 0
		for i := range 4 {
			a := startNode(t, dsn, "users", "id", "A", parseInt64, conf)
			time.Sleep(300 * time.Millisecond)
			c, n := a.wrong404s(t)
			checked, wrong = checked+c, wrong+n
			st := a.follower.Stats()
			if i > 0 && st.SnapshotStart != 1 {
				t.Errorf("restart %d read the table: %+v", i, st.FullReads)
			}
			a.halt()
		}
		w.halt()
		t.Logf("4 starts, 3 of them from the file, while %d rows were written: %d keys checked, %d wrong 404s", w.n.Load(), checked, wrong)
		if wrong != 0 {
			t.Errorf("%d wrong 404s", wrong)
		}
	})
}

// TestScenarioKeyTypesAndNames follows tables with text and uuid keys, in
// a schema, table and key column whose names need quotes, and inserts
// through the Loader with tagged keys.
func TestScenarioKeyTypesAndNames(t *testing.T) {
	ctx := context.Background()
	canonicalUUID := func(s string) (string, error) {
		s = strings.ToLower(strings.ReplaceAll(s, "-", ""))
		if len(s) != 32 {
			return "", fmt.Errorf("not a uuid: %q", s)
		}
		return s[:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:], nil
	}
	for _, tc := range []struct {
		name, typ string
		parse     func(string) (string, error)
		key       func(i int) string
	}{
		{"text", "text", parseText, func(i int) string { return fmt.Sprintf("user-%d@Example.com", i) }},
		{"uuid", "uuid", canonicalUUID, func(i int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, _ := pgConn(t)
			dsn := dsnOf(t, db)
			schema := fmt.Sprintf("Mixed Case %d", time.Now().UnixNano()%1e6)
			table := pgx.Identifier{schema, "User Accounts"}.Sanitize()
			execAll(t, dsn, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize(),
				`CREATE TABLE `+table+` ("AccountKey" `+tc.typ+` PRIMARY KEY, name text)`)
			t.Cleanup(func() {
				// A publication and slots belong to the database, not to
				// the schema: Unpublish, then drop the schema.
				if err := Unpublish(context.Background(), connect(t, dsn), table); err != nil {
					t.Error(err)
				}
				execAll(t, dsn, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			})
			for i := range 100 {
				execAll(t, dsn, `INSERT INTO `+table+` VALUES (`+quoteLiteral(tc.key(i))+`, 'seed')`)
			}
			if err := Publish(ctx, db, table, "AccountKey"); err != nil {
				t.Fatal(err)
			}
			a := startNode(t, dsn, table, "AccountKey", "A", tc.parse, nodeConf{})
			for i := 100; i < 150; i++ { // through the Loader, tagged
				k := tc.key(i)
				err := a.loader.Insert(ctx, k, func(ctx context.Context) error {
					return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
						if err := a.follower.Tag(ctx, tx, k); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 'A')`, k)
						return err
					})
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			for i := 150; i < 200; i++ { // another process
				execAll(t, dsn, `INSERT INTO `+table+` VALUES (`+quoteLiteral(tc.key(i))+`, 'other')`)
			}
			execAll(t, dsn, `DELETE FROM `+table+` WHERE name = 'seed' AND "AccountKey" IN (SELECT "AccountKey" FROM `+table+` LIMIT 10)`)
			expectNoWrong404s(t, a, tc.name+" keys in "+table)
			if st := a.follower.Stats(); st.Skipped != 50 {
				t.Errorf("%d own inserts skipped, want 50", st.Skipped)
			}
		})
	}
	t.Run("uuid not in canonical form", func(t *testing.T) {
		// A key the Loader would add in another form than the table's:
		// Tag refuses it, rather than skip the stored form's insert.
		l := emptyLoaderOf[string](t)
		f, err := NewFollower(l, "postgres://x@127.0.0.1:1/x", "t", "k", canonicalUUID, WithOrigin("A"))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.TagQuery("9F077349-BB9C-4C4B-8C1F-1B2B3C4D5E6F"); err == nil || !strings.Contains(err.Error(), "does not read back") {
			t.Fatalf("TagQuery of an upper-case uuid = %v, want an error that says it does not read back", err)
		}
		if _, _, err := f.TagQuery("9f077349-bb9c-4c4b-8c1f-1b2b3c4d5e6f"); err != nil {
			t.Fatalf("TagQuery of a canonical uuid: %v", err)
		}
	})
}
