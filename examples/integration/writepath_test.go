package integration

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/examples/internal/pgtest"
	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// TestInsertGeneratedPanicAfterCommit is the first case of issue 44 on
// SQLite: one multi-row INSERT … RETURNING makes three rows, whose ids
// the write adds to the guard; a lookup of each before the commit reads
// no row, and the negative cache learns that; the write commits and then
// panics. Its outcome is unknown to the Loader, which must void what
// those lookups cached: every committed row must read present at once.
// (InsertGenerated voided it outside a defer: 3 of 3 rows read ErrNotFound
// until the entries' TTL.)
func TestInsertGeneratedPanicAfterCommit(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, filepath.Join(t.TempDir(), "users.db"))
	l := newLoaderWith(t, db, nil, guarded.WithNegativeCache(100, time.Hour))
	l.MarkReady()
	var ids []int64
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("the write's panic did not reach the caller")
			}
		}()
		l.InsertGenerated(ctx, func(ctx context.Context, add func(int64) error) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			rows, err := tx.QueryContext(ctx, `INSERT INTO users (name) VALUES ('a'), ('b'), ('c') RETURNING id`)
			if err != nil {
				return err
			}
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return err
				}
				ids = append(ids, id)
			}
			if err := rows.Close(); err != nil {
				return err
			}
			for _, id := range ids {
				if err := add(id); err != nil {
					return err
				}
			}
			for _, id := range ids {
				// Another connection, before the commit: no row yet.
				if _, err := l.Get(ctx, id); !errors.Is(err, guarded.ErrNotFound) {
					t.Errorf("Get(%d) before the commit = %v, want ErrNotFound", id, err)
				}
			}
			if err := tx.Commit(); err != nil {
				return err
			}
			panic("after the commit")
		})
	}()
	if len(ids) != 3 {
		t.Fatalf("INSERT … RETURNING gave ids %v, want 3", ids)
	}
	wrong := 0
	for _, id := range ids {
		if _, err := db.Lookup(ctx, id); err != nil {
			t.Fatalf("row %d was not committed: %v", id, err)
		}
		if _, err := l.Get(ctx, id); err != nil {
			t.Errorf("Get(%d) of a committed row = %v", id, err)
			wrong++
		}
	}
	t.Logf("%d of %d committed rows read ErrNotFound", wrong, len(ids))
}

// TestUnclearCommitThenRebuild is the second case of issue 44 on
// PostgreSQL: an Insert's write leaves its transaction to commit later
// and returns ErrMaybeWritten (a deadline, a lost reply: the client does
// not know), a rebuild reads SELECT id FROM users before the commit, and
// the commit becomes visible after it. The committed row must not read
// ErrNotFound. (The rebuilt guard lacked the key: 1 of 1 row read
// ErrNotFound until the next rebuild.)
func TestUnclearCommitThenRebuild(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, pgtest.Schema(t, pgtest.DSN(t)))
	if err := db.Seed(ctx, 100, nil); err != nil {
		t.Fatal(err)
	}
	// Any estimated false-positive rate is too high: the Loader rebuilds
	// after Fill and every 4096 inserts, which is how this test asks for
	// a rebuild from outside the package.
	l := newLoaderWith(t, db, []guard.Option{guard.WithCapacity(1000)}, guarded.WithMaxFPR(1e-300))
	if err := l.Fill(ctx, db.IDs(ctx)); err != nil {
		t.Fatal(err)
	}
	waitRebuilds(l, 1)
	const id = 777_777
	var pending *sql.Tx
	err := l.Insert(ctx, id, func(ctx context.Context) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO users (id, name) VALUES ($1, 'late')`, id); err != nil {
			tx.Rollback()
			return err
		}
		pending = tx // the server commits it after the client gave up
		return guarded.ErrMaybeWritten
	})
	if !errors.Is(err, guarded.ErrMaybeWritten) || pending == nil {
		t.Fatalf("Insert = %v", err)
	}
	rebuildOnce(t, l)
	if _, err := db.Lookup(ctx, id); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("the row is visible before its commit: %v", err)
	}
	if err := pending.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Lookup(ctx, id); err != nil {
		t.Fatalf("the row is not visible after its commit: %v", err)
	}
	if u, err := l.Get(ctx, id); err != nil || u.ID != id {
		t.Fatalf("Get(%d) of a row committed after the rebuild's read = %+v, %v", id, u, err)
	}
	st := l.Stats()
	t.Logf("rebuilds %d, keys of unknown outcome kept %d", st.Rebuilds, st.Unsettled)
}

// rebuildOnce makes l rebuild from its key source (l has WithMaxFPR so
// low that every check asks for one) and waits for the rebuild: 4096
// inserts whose writes do nothing reach the next check.
func rebuildOnce(t *testing.T, l *guarded.Loader[int64, userdb.User]) {
	t.Helper()
	n := l.Stats().Rebuilds
	for i := int64(0); l.Stats().Rebuilds == n; i++ {
		if err := l.Insert(context.Background(), 1<<50+i, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if i%4096 == 4095 {
			waitRebuilds(l, n+1)
		}
	}
	waitRebuilds(l, n+1)
}

// waitRebuilds waits until l has swapped in n rebuilt guards and runs no
// rebuild.
func waitRebuilds(l *guarded.Loader[int64, userdb.User], n uint64) {
	for st := l.Stats(); st.Rebuilding || st.Rebuilds < n; st = l.Stats() {
		runtime.Gosched()
	}
}
