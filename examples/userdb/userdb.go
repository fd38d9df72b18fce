// Package userdb is the small users table that the examples and the
// integration tests guard: open SQLite or PostgreSQL, create and seed the
// table, and look up, insert and delete rows while counting queries.
package userdb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	"modernc.org/sqlite"               // registers "sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// User is one row of the users table.
type User struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
}

// DB is a users table in SQLite or PostgreSQL. It counts the lookups it
// runs, so that callers can see what a guard saved.
type DB struct {
	*sql.DB
	Driver       string       // "sqlite" or "pgx"
	Lookups      atomic.Int64 // SELECT ... WHERE id = $1 queries run
	BatchLookups atomic.Int64 // LookupMany calls

	// Tag, if set, gives the statement and its arguments that name, in
	// the transaction of an Insert on PostgreSQL, the key this process's
	// Loader added (postgres.Follower.TagQuery), so that its follower
	// skips that insert. Set it only when every Insert runs inside
	// guarded.Loader.Insert.
	Tag func(ids ...int64) (query string, args []any, err error)
}

// DefaultSQLitePath is where Open keeps the SQLite database when dsn is "".
func DefaultSQLitePath(name string) string {
	return filepath.Join(os.TempDir(), "cuckooguard-"+name+".db")
}

// Open opens dsn: a postgres:// or postgresql:// URL uses PostgreSQL
// through pgx; anything else is a SQLite file path (embedded, pure Go).
func Open(ctx context.Context, dsn string) (*DB, error) {
	driver, source := "sqlite", dsn
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		driver = "pgx"
	} else {
		// WAL lets readers run while one writer writes; busy_timeout makes
		// concurrent writers wait instead of failing with SQLITE_BUSY.
		source = "file:" + dsn + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	}
	db, err := sql.Open(driver, source)
	if err != nil {
		return nil, fmt.Errorf("userdb: open: %w", err)
	}
	if driver == "sqlite" {
		db.SetMaxOpenConns(8)
	} else {
		// database/sql keeps 2 idle connections by default: under load
		// every other query then opens a new PostgreSQL backend (about
		// 80 per second in the example service) and waits for it. Keep
		// as many idle as may be open, and let them go after a while.
		db.SetMaxOpenConns(32)
		db.SetMaxIdleConns(32)
		db.SetConnMaxIdleTime(5 * time.Minute)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("userdb: ping %s: %w", driver, err)
	}
	return &DB{DB: db, Driver: driver}, nil
}

// Migrate creates the users table if it does not exist. On PostgreSQL,
// processes that start together take turns: two CREATE TABLE IF NOT
// EXISTS at once fail with a duplicate key in pg_type.
func (d *DB) Migrate(ctx context.Context) error {
	const create = `CREATE TABLE IF NOT EXISTS users (id BIGINT PRIMARY KEY, name TEXT NOT NULL)`
	if d.Driver != "pgx" {
		if _, err := d.ExecContext(ctx, create); err != nil {
			return fmt.Errorf("userdb: create table: %w", err)
		}
		return nil
	}
	tx, err := d.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("userdb: create table: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('userdb migrate'))`); err != nil {
		return fmt.Errorf("userdb: create table: %w", err)
	}
	if _, err := tx.ExecContext(ctx, create); err != nil {
		return fmt.Errorf("userdb: create table: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("userdb: create table: %w", err)
	}
	return nil
}

// Seed makes sure users 1..n exist, inserting the missing ones in batches,
// and calls progress with the number of ids done after each batch.
func (d *DB) Seed(ctx context.Context, n int64, progress func(done int64)) error {
	const batch = 5000
	for lo := int64(1); lo <= n; lo += batch {
		hi := min(lo+batch-1, n)
		tx, err := d.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("userdb: seed: %w", err)
		}
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO users (id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING`)
		if err != nil {
			tx.Rollback()
			return fmt.Errorf("userdb: seed: %w", err)
		}
		for id := lo; id <= hi; id++ {
			if _, err := stmt.ExecContext(ctx, id, fmt.Sprintf("user %d", id)); err != nil {
				tx.Rollback()
				return fmt.Errorf("userdb: seed id %d: %w", id, err)
			}
		}
		stmt.Close()
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("userdb: seed: %w", err)
		}
		if progress != nil {
			progress(hi)
		}
	}
	return nil
}

// SeedExactly makes the table hold exactly users 1..n, and reports whether
// it found them there already (a file kept from an earlier run), in which
// case it wrote nothing. Otherwise it deletes the rows outside 1..n and
// inserts the missing ones, as Seed does.
func (d *DB) SeedExactly(ctx context.Context, n int64, progress func(done int64)) (reused bool, err error) {
	var count, maxID sql.NullInt64
	if err := d.QueryRowContext(ctx, `SELECT COUNT(*), MAX(id) FROM users`).Scan(&count, &maxID); err != nil {
		return false, fmt.Errorf("userdb: count users: %w", err)
	}
	if count.Int64 == n && maxID.Int64 == n {
		if progress != nil {
			progress(n)
		}
		return true, nil
	}
	if _, err := d.ExecContext(ctx, `DELETE FROM users WHERE id > $1 OR id < 1`, n); err != nil {
		return false, fmt.Errorf("userdb: trim users: %w", err)
	}
	return false, d.Seed(ctx, n, progress)
}

// Lookup returns the user with the given id, or an error wrapping
// sql.ErrNoRows.
func (d *DB) Lookup(ctx context.Context, id int64) (User, error) {
	d.Lookups.Add(1)
	u := User{ID: id}
	err := d.QueryRowContext(ctx, `SELECT name FROM users WHERE id = $1`, id).Scan(&u.Name)
	if err != nil {
		return User{}, fmt.Errorf("userdb: user %d: %w", id, err)
	}
	return u, nil
}

// LookupMany returns the users of ids that exist, by id, in one query per
// 500 ids: WHERE id = ANY($1) on PostgreSQL, WHERE id IN (…) on SQLite.
// It counts one lookup in BatchLookups per call.
func (d *DB) LookupMany(ctx context.Context, ids []int64) (map[int64]User, error) {
	d.BatchLookups.Add(1)
	found := make(map[int64]User, len(ids))
	const chunk = 500 // below SQLite's limit on bound parameters
	for lo := 0; lo < len(ids); lo += chunk {
		part := ids[lo:min(lo+chunk, len(ids))]
		var rows *sql.Rows
		var err error
		if d.Driver == "pgx" {
			rows, err = d.QueryContext(ctx, `SELECT id, name FROM users WHERE id = ANY($1)`, part)
		} else {
			args := make([]any, len(part))
			for i, id := range part {
				args[i] = id
			}
			q := `SELECT id, name FROM users WHERE id IN (?` + strings.Repeat(`, ?`, len(part)-1) + `)`
			rows, err = d.QueryContext(ctx, q, args...)
		}
		if err != nil {
			return nil, fmt.Errorf("userdb: look up %d users: %w", len(ids), err)
		}
		for rows.Next() {
			var u User
			if err := rows.Scan(&u.ID, &u.Name); err != nil {
				rows.Close()
				return nil, fmt.Errorf("userdb: look up %d users: %w", len(ids), err)
			}
			found[u.ID] = u
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("userdb: look up %d users: %w", len(ids), err)
		}
		rows.Close()
	}
	return found, nil
}

// ErrExists is returned by Insert for an id that is taken. It wraps
// guarded.ErrNotWritten: the INSERT certainly created no row, so a Loader
// takes the id back out of its guard.
var ErrExists = fmt.Errorf("userdb: user exists (%w)", guarded.ErrNotWritten)

// Insert creates u. It returns ErrExists if the id is taken. An error
// that shows the INSERT did not run (the server refused it, or SQLite's
// database was busy or locked) wraps guarded.ErrNotWritten or carries a
// SQLSTATE, which guarded.NotWritten reads; any other error leaves the
// outcome unknown.
func (d *DB) Insert(ctx context.Context, u User) error {
	const insert = `INSERT INTO users (id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	var res sql.Result
	var err error
	if d.Tag != nil && d.Driver == "pgx" {
		res, err = d.insertTagged(ctx, insert, u)
	} else {
		res, err = d.ExecContext(ctx, insert, u.ID, u.Name)
	}
	if err != nil {
		if d.Driver == "sqlite" && sqliteRefused(err) {
			// One statement in its own transaction, on a local file: a
			// busy or locked database ran none of it.
			return fmt.Errorf("userdb: insert user %d: %w (%w)", u.ID, err, guarded.ErrNotWritten)
		}
		return fmt.Errorf("userdb: insert user %d: %w", u.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("userdb: insert user %d: %w", u.ID, err)
	} else if n == 0 {
		return ErrExists
	}
	return nil
}

// insertTagged runs insert in a transaction that names u's key with d.Tag,
// as postgres.Follower.Tag does for pgx.
func (d *DB) insertTagged(ctx context.Context, insert string, u User) (sql.Result, error) {
	tx, err := d.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	q, args, err := d.Tag(u.ID)
	if err != nil {
		return nil, err
	}
	if q != "" { // "" without an origin: nothing to tag
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return nil, err
		}
	}
	res, err := tx.ExecContext(ctx, insert, u.ID, u.Name)
	if err != nil {
		return nil, err
	}
	return res, tx.Commit()
}

// Delete deletes the user with the given id and reports whether it
// existed.
func (d *DB) Delete(ctx context.Context, id int64) (bool, error) {
	res, err := d.ExecContext(ctx, `DELETE FROM users WHERE id = $1`, id)
	if err != nil {
		return false, fmt.Errorf("userdb: delete user %d: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("userdb: delete user %d: %w", id, err)
	}
	return n > 0, nil
}

// IDs iterates over every id in the table, streaming the rows.
func (d *DB) IDs(ctx context.Context) iter.Seq2[int64, error] {
	return func(yield func(int64, error) bool) {
		rows, err := d.QueryContext(ctx, `SELECT id FROM users`)
		if err != nil {
			yield(0, fmt.Errorf("userdb: list ids: %w", err))
			return
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				yield(0, fmt.Errorf("userdb: list ids: %w", err))
				return
			}
			if !yield(id, nil) {
				return
			}
		}
		if err := rows.Err(); err != nil {
			yield(0, fmt.Errorf("userdb: list ids: %w", err))
		}
	}
}

// Unavailable reports whether err says the database could not be reached,
// went away, or did not answer in time, rather than that it refused the
// statement: a refused, lost or closed connection, a timeout, SQLite's
// busy database, and PostgreSQL's errors about the server rather than the
// statement, by SQLSTATE class: 08 (connection exception), 53
// (insufficient resources, such as too many connections) and 57 (operator
// intervention: 57P01 "terminating connection due to administrator
// command" during a restart, 57P03 "the database system is starting up").
// Callers answer such errors with 503 Service Unavailable.
func Unavailable(err error) bool {
	var connect *pgconn.ConnectError
	var nerr net.Error
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "08", "53", "57":
			return true
		}
	}
	return errors.As(err, &connect) || errors.As(err, &nerr) ||
		pgconn.SafeToRetry(err) || pgconn.Timeout(err) || // "conn closed", a connection that broke before the query left
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, context.DeadlineExceeded) || sqliteRefused(err)
}

// sqliteRefused reports whether err is SQLite's SQLITE_BUSY or
// SQLITE_LOCKED (with any extended code): the statement could not take
// the lock it needed and changed nothing.
func sqliteRefused(err error) bool {
	var serr *sqlite.Error
	if !errors.As(err, &serr) {
		return false
	}
	code := serr.Code() & 0xff
	return code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED
}

// Count returns the number of rows.
func (d *DB) Count(ctx context.Context) (int64, error) {
	var n int64
	err := d.QueryRowContext(ctx, `SELECT COUNT(*) FROM users`).Scan(&n)
	return n, err
}
