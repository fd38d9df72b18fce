package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestChurnWrong404 checks every committed key of a one-column numeric
// table through a logical follower while three other clients insert,
// delete, and update keys and names, and counts the keys that read
// absent after the follower said it was current with their commit,
// whose row version (its xmin) still exists after the lookup. With
// -race and PostgreSQL 15.18 it found 1 or 2 such keys in about 100,000
// checked in 4 of 20 runs on main (fb57fc0), 15 of 30 on this branch,
// and 2 of 20 with rows picked by id rather than by ctid; none when the
// same checks ran only after the writes ended (15 runs). It predates keys
// of several columns (TestTupleKeysMultiTenant sees it too).
//
// The cause, as a hook on the applier's commits showed in 6 of 6 cases:
// the follower applies a transaction that deletes the key (or updates it
// away) as soon as the stream carries its commit record, and at the
// lookup pg_xact_status of that transaction is still 'in progress': the
// server has written the commit but not yet made it visible
// (ProcArrayEndTransaction comes after the WAL flush, and after the wait
// for a synchronous standby), so the row is still what every query
// finds, and the guard already says absent. Deletions now wait for the
// same proof of visibility that DESIGN §10 asks of a read's position
// (apply.go's release: a heartbeat whose snapshot sees the transaction);
// with deletions applied when decoded again, this test fails in about
// one run of five (-count=20).
func TestChurnWrong404(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn, `CREATE TABLE single (id numeric PRIMARY KEY, name text)`,
		`INSERT INTO single SELECT ((g/10)::text || '.' || (g%10)::text || '0')::numeric, 'seed' FROM generate_series(0, 599) g`)
	if err := Publish(ctx, db, "single", "id"); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, dsn, "single", "id", "A", parseText, nodeConf{})
	c := connect(t, dsn)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var next atomic.Int64
	next.Store(1_000_000)
	for w := range 3 {
		wc := connect(t, dsn)
		wg.Go(func() {
			r := rand.New(rand.NewPCG(1, uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := func() string { k := next.Add(1); return fmt.Sprintf("%d.%d0", k/10, k%10) }
				var q string
				var args []any
				switch r.IntN(6) {
				case 0, 1:
					q, args = `INSERT INTO single VALUES ($1, 'w')`, []any{id()}
				case 2:
					q = `DELETE FROM single WHERE ctid = (SELECT ctid FROM single TABLESAMPLE SYSTEM (5) LIMIT 1)`
				case 3:
					q, args = `UPDATE single SET id = $1 WHERE ctid = (SELECT ctid FROM single TABLESAMPLE SYSTEM (5) LIMIT 1)`, []any{id()}
				case 4:
					// The same key deleted and created again, several times
					// within a heartbeat: its deletions are held meanwhile.
					var k string
					err := wc.QueryRow(ctx, `DELETE FROM single WHERE ctid = (SELECT ctid FROM single TABLESAMPLE SYSTEM (5) LIMIT 1) RETURNING id::text`).Scan(&k)
					if errors.Is(err, pgx.ErrNoRows) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					// (Another writer's sampled delete may take the row and
					// its next round insert the key: a duplicate ends the
					// round.)
					for range 5 {
						if _, err := wc.Exec(ctx, `INSERT INTO single VALUES ($1, 'again')`, k); err != nil {
							break
						}
						if _, err := wc.Exec(ctx, `DELETE FROM single WHERE id = $1`, k); err != nil {
							t.Error(err)
							return
						}
					}
					q, args = `INSERT INTO single VALUES ($1, 'again') ON CONFLICT DO NOTHING`, []any{k}
				default:
					q = `UPDATE single SET name = name || '.' WHERE ctid = (SELECT ctid FROM single TABLESAMPLE SYSTEM (5) LIMIT 1)`
				}
				if _, err := wc.Exec(ctx, q, args...); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	var checked, wrong int
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		rows, err := c.Query(ctx, `SELECT id::text, xmin::text FROM single`)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
			var k [2]string
			return k, r.Scan(&k[0], &k[1])
		})
		if err != nil {
			t.Fatal(err)
		}
		n.waitCurrent(t)
		for _, k := range keys {
			checked++
			key, err := n.follower.Key(k[0])
			if err != nil {
				t.Fatal(err)
			}
			if n.loader.MayContain(key) || !n.loader.Ready() {
				continue
			}
			var same bool // the row version read before the wait is still there
			if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT FROM single WHERE id = $1 AND xmin::text = $2)`, k[0], k[1]).Scan(&same); err != nil {
				t.Fatal(err)
			}
			if same {
				wrong++
				t.Errorf("wrong 404: key %s (xmin %s), committed before the follower's last heartbeat, reads absent: %+v", k[0], k[1], n.follower.Stats())
			}
		}
	}
	t.Logf("%d keys checked while other clients wrote, %d wrong 404s", checked, wrong)
}
