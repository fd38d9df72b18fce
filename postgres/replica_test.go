package postgres

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// replica is one simulated process that follows the users table (node,
// harness_test.go).
type replica = node[int64]

func parseID(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

// startReplica starts a replica and waits until its follower follows.
func startReplica(t *testing.T, dsn, id string) *replica {
	t.Helper()
	return startReplicaVia(t, dsn, dsn, id)
}

// startReplicaVia is startReplica with the follower connecting to
// followDSN (through a proxy, say) and the given follower options.
func startReplicaVia(t *testing.T, dsn, followDSN, id string, opts ...Option) *replica {
	t.Helper()
	return startReplicaOn(t, dsn, followDSN, "users", id, opts...)
}

// startReplicaOn is startReplicaVia for a table other than users (with the
// same columns), with the default heartbeat.
func startReplicaOn(t *testing.T, dsn, followDSN, table, id string, opts ...Option) *replica {
	t.Helper()
	return startNode(t, dsn, table, "id", id, parseID, nodeConf{followDSN: followDSN, heartbeat: DefaultHeartbeat, opts: opts, noWait: true, following: true})
}

// setupUsers creates the users table with the trigger in a fresh schema
// and returns a DSN whose connections use that schema.
func setupUsers(t *testing.T, seed int) string {
	t.Helper()
	ctx := context.Background()
	db, _ := pgConn(t)
	if _, err := db.Exec(ctx, `CREATE TABLE users (id BIGINT PRIMARY KEY, name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO users SELECT g, 'seed' FROM generate_series(1, $1::int) g`, seed); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, db, "users", "id"); err != nil {
		t.Fatal(err)
	}
	if err := Publish(ctx, db, "users", "id"); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := db.Config()
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&search_path=%s", cfg.User, cfg.Host, cfg.Port, cfg.Database, schema)
}

// converge waits until every replica's guard holds every live id, and at
// least one copy for each: every creation added one copy (the writer's
// Loader, the others' feeds, or a resync's read) and every delete removed
// one, whichever replica made it. A missing copy would be a false negative
// waiting for a colliding key. An insert through a replica that commits
// while that replica's resync reads the table is counted twice (a false
// positive until the next resync); converge logs such extra copies.
func converge(t *testing.T, replicas []*replica, live func() []int64) time.Duration {
	t.Helper()
	start := time.Now()
	ids := live()
	for _, r := range replicas {
		r.waitFollowing(t)
		for _, id := range ids {
			for !r.loader.MayContain(id) {
				if time.Since(start) > 30*time.Second {
					t.Fatalf("replica %s never learned of id %d: %+v", r.id, id, r.follower.Stats())
				}
				runtime.Gosched()
			}
		}
		for r.loader.Guard().Len() < len(ids) {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("replica %s holds %d copies for %d live ids: %+v", r.id, r.loader.Guard().Len(), len(ids), r.follower.Stats())
			}
			runtime.Gosched()
		}
		if extra := r.loader.Guard().Len() - len(ids); extra > 0 {
			t.Logf("replica %s: %d extra copies (inserts that raced a resync)", r.id, extra)
		}
	}
	return time.Since(start)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	slices.Sort(ds)
	return ds[int(p*float64(len(ds)-1))]
}

// emptyLoader returns a Loader over a new default guard whose store finds
// nothing: what a follower test needs when it looks at the follower only.
func emptyLoader(t testing.TB) *guarded.Loader[int64, string] {
	t.Helper()
	return emptyLoaderOf[int64](t)
}
