package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/cuckooguard/cuckooguard/examples/internal/pgtest"
	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
)

// lostCommitTries is how many writes each client makes whose COMMIT reply
// is lost: the defect reproduced in 5 of 5 tries.
const lostCommitTries = 5

// TestLostCommitReplyKeepsKey is the first defect of the client-found
// issue: the server commits a row, and the connection that carries the
// COMMIT's completion is reset before the client reads it. pgx then
// reports an error that is "safe to retry", and a Loader that trusted it
// took the key back: the committed row read 404 until the next resync.
// The write's outcome is unknown, so the key must stay. Each client of
// PostgreSQL that the examples use gets the same reset, through a proxy
// that lets everything through but the one CommandComplete "COMMIT".
func TestLostCommitReplyKeepsKey(t *testing.T) {
	dsn := pgtest.Schema(t, pgtest.DSN(t))
	// insertTx is the write each client runs: one INSERT in a transaction.
	type insertTx func(ctx context.Context, id int64) error
	clients := []struct {
		name string
		open func(t *testing.T, dsn string) insertTx
	}{
		{"pgx.Conn", func(t *testing.T, dsn string) insertTx {
			var conn *pgx.Conn
			return func(ctx context.Context, id int64) error {
				if conn == nil || conn.IsClosed() {
					var err error
					if conn, err = pgx.Connect(ctx, dsn); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { conn.Close(context.Background()) })
				}
				return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO users (id, name) VALUES ($1, 'x')`, id)
					return err
				})
			}
		}},
		{"pgxpool", func(t *testing.T, dsn string) insertTx {
			pool, err := pgxpool.New(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return func(ctx context.Context, id int64) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO users (id, name) VALUES ($1, 'x')`, id)
					return err
				})
			}
		}},
		{"database/sql+stdlib", func(t *testing.T, dsn string) insertTx {
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return func(ctx context.Context, id int64) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, `INSERT INTO users (id, name) VALUES ($1, 'x')`, id); err != nil {
					return err
				}
				return tx.Commit()
			}
		}},
	}
	db := openDB(t, dsn) // creates the table; reads go straight to the server
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for ci, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			p, err := tcpproxy.Start(u.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			via := *u
			via.Host = p.Addr()
			insert := c.open(t, via.String())
			l := newLoader(t, db)
			l.MarkReady()
			for try := range lostCommitTries {
				id := int64(1000*(ci+1) + try)
				p.ResetOnCommandComplete("COMMIT")
				werr := l.Insert(ctx, id, func(ctx context.Context) error { return insert(ctx, id) })
				if p.Resets() != try+1 {
					t.Fatalf("try %d: the proxy reset %d connections, want %d", try, p.Resets(), try+1)
				}
				if werr == nil {
					t.Fatalf("try %d: the write reported success although its COMMIT reply was lost", try)
				}
				if _, err := db.Lookup(ctx, id); err != nil {
					t.Fatalf("try %d: the row was not committed (%v); the test needs a committed row", try, err)
				}
				var safe interface{ SafeToRetry() bool }
				t.Logf("try %d: write error %q (%T; safe to retry: %v)", try, werr, werr, errors.As(werr, &safe) && safe.SafeToRetry())
				if got, err := l.Get(ctx, id); err != nil || got.ID != id {
					t.Fatalf("try %d: Get(%d) = %+v, %v for a committed row whose COMMIT reply was lost", try, id, got, err)
				}
			}
		})
	}
}

// TestRefusedWriteRollsBack: a write that the store refused changed
// nothing, and its key leaves the guard again: a unique violation
// answered by PostgreSQL (a SQLSTATE), and SQLite's busy database, which
// userdb marks with guarded.ErrNotWritten. The same SQLite error unmarked
// proves nothing to the Loader, which keeps the key. (SQLITE_LOCKED, which
// userdb marks alike, does not reach a one-statement INSERT through this
// driver: it waits for shared-cache locks instead.)
func TestRefusedWriteRollsBack(t *testing.T) {
	ctx := context.Background()
	t.Run("postgres unique violation", func(t *testing.T) {
		dsn := pgtest.Schema(t, pgtest.DSN(t))
		db := openDB(t, dsn)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		l := newLoader(t, db)
		l.MarkReady()
		insert := func(ctx context.Context) error {
			_, err := conn.Exec(ctx, `INSERT INTO users (id, name) VALUES (1, 'x')`)
			return err
		}
		if err := l.Insert(ctx, 1, insert); err != nil {
			t.Fatal(err)
		}
		err = l.Insert(ctx, 1, insert)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Fatalf("second insert = %v, want a unique violation", err)
		}
		if n := l.Guard().Len(); n != 1 {
			t.Fatalf("guard holds %d copies after one row and one refused insert, want 1", n)
		}
	})

	// sqliteConn opens path with params and returns one connection of
	// it.
	sqliteConn := func(t *testing.T, path, params string) *sql.Conn {
		sdb, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(0)"+params)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sdb.Close() })
		c, err := sdb.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// checkRefused checks that a write refused with SQLite result code
	// code, marked by userdb, left the guard as it was, and that the
	// driver's error alone keeps the key.
	checkRefused := func(t *testing.T, l *guarded.Loader[int64, userdb.User], err error, code int) {
		t.Helper()
		var serr *sqlite.Error
		if !errors.As(err, &serr) || serr.Code()&0xff != code {
			t.Fatalf("Insert = %v, want SQLite result code %d", err, code)
		}
		if !errors.Is(err, guarded.ErrNotWritten) {
			t.Fatalf("Insert = %v, not marked as not written", err)
		}
		if n := l.Guard().Len(); n != 0 {
			t.Fatalf("guard holds %d copies after a refused insert, want 0", n)
		}
		raw := fmt.Errorf("insert: %w", serr)
		if guarded.NotWritten(raw) {
			t.Fatalf("NotWritten(%v) = true for an error type it cannot read", raw)
		}
		l.Insert(ctx, 8, func(context.Context) error { return raw })
		if !l.MayContain(8) {
			t.Fatal("the Loader took back a key whose write's error proves nothing")
		}
	}
	t.Run("sqlite busy", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "users.db")
		db := openDB(t, path) // creates the table
		const wal = "&_pragma=journal_mode(WAL)"
		holder := sqliteConn(t, path, wal)
		if _, err := holder.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
			t.Fatal(err)
		}
		defer holder.ExecContext(ctx, `ROLLBACK`)
		wdb, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(0)"+wal)
		if err != nil {
			t.Fatal(err)
		}
		defer wdb.Close()
		writer := &userdb.DB{DB: wdb, Driver: "sqlite"}
		l := newLoader(t, db)
		l.MarkReady()
		err = l.Insert(ctx, 7, func(ctx context.Context) error { return writer.Insert(ctx, userdb.User{ID: 7, Name: "a"}) })
		checkRefused(t, l, err, sqlite3.SQLITE_BUSY)
	})
}
