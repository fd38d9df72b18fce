// Command owntable is the README's "Add the guard to your own table": an
// accounts table keyed by a uuid that PostgreSQL generates
// (DEFAULT gen_random_uuid()), guarded in this process, kept in step with
// other processes' writes through logical decoding, and served over HTTP
// with keys in their canonical form, whatever case a client writes them
// in. It prints what it does, and removes its table, publication and slot
// at the end.
//
//	go -C examples run ./owntable -dsn postgres://user@localhost/db
//
// The server needs wal_level = logical, and the user the REPLICATION
// attribute and the right to create a table.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/middleware"
	"github.com/cuckooguard/cuckooguard/postgres"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("CUCKOOGUARD_PG_DSN"), "postgres:// URL (default $CUCKOOGUARD_PG_DSN)")
	flag.Parse()
	if err := run(context.Background(), *dsn); err != nil {
		fmt.Fprintln(os.Stderr, "owntable:", err)
		os.Exit(1)
	}
}

// account is one row of the accounts table.
type account struct {
	ID    uuid.UUID
	Email string
}

func run(ctx context.Context, dsn string) error {
	if dsn == "" {
		return errors.New("give -dsn postgres://… (or set CUCKOOGUARD_PG_DSN)")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Your table. The key is the primary key (deletes carry only the
	// replica identity), and the database generates it.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS accounts (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		email text NOT NULL)`); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	defer cleanUp(conn)
	if err := postgres.Publish(ctx, conn, "accounts", "id"); err != nil {
		return err
	}

	// The guard, the Loader over the table, and the follower that keeps
	// the guard in step with every process's writes. uuid.UUID is a byte
	// array: the guard compares its 16 bytes, one form for every way a
	// client writes the id.
	g, err := guard.New(guard.WithCapacity(1_000_000))
	if err != nil {
		return err
	}
	var queries int
	lookup := func(ctx context.Context, id uuid.UUID) (account, error) {
		queries++
		a := account{ID: id}
		err := pool.QueryRow(ctx, `SELECT email FROM accounts WHERE id = $1`, id).Scan(&a.Email)
		return a, err
	}
	accounts, err := guarded.New(g, guarded.GetterFunc[uuid.UUID, account](lookup),
		guarded.WithNotFound(func(err error) bool { return errors.Is(err, pgx.ErrNoRows) }))
	if err != nil {
		return err
	}
	defer accounts.Close()
	// No origin: the follower's replication slot is temporary and goes
	// with the process. Give each replica of a real service a stable
	// origin (postgres.WithOrigin) to resume after a lost connection.
	f, err := postgres.NewFollower(accounts, dsn, "accounts", "id", uuid.Parse,
		postgres.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		return err
	}
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	defer func() { stop(); <-done }()
	if err := waitFor(func() bool { return accounts.Ready() }); err != nil {
		return fmt.Errorf("the follower did not follow: %v", f.Stats().LastError)
	}
	fmt.Println("following the accounts table")

	// A new account: the database generates its id. The Loader adds the
	// id the INSERT returns before the transaction commits, and the
	// transaction names it, so that the follower skips exactly this
	// insert (its guard has the key already).
	var id uuid.UUID
	err = accounts.InsertGenerated(ctx, func(ctx context.Context, add func(uuid.UUID) error) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `INSERT INTO accounts (email) VALUES ($1) RETURNING id`, "ada@example.com").Scan(&id); err != nil {
				return err
			}
			if err := add(id); err != nil {
				return err
			}
			return f.Tag(ctx, tx, id)
		})
	})
	if err != nil {
		return err
	}
	if _, err := accounts.Get(ctx, id); err != nil {
		return fmt.Errorf("the new account: %w", err)
	}
	fmt.Println("created an account and found it at once")
	before := queries
	if _, err := accounts.Get(ctx, uuid.New()); !errors.Is(err, guarded.ErrNotFound) || queries != before {
		return fmt.Errorf("an id nobody created: %v after %d queries", err, queries-before)
	}
	fmt.Println("an unknown id: not found, without a query")

	// Another process's account reaches this guard through the stream.
	var other uuid.UUID
	if err := pool.QueryRow(ctx, `INSERT INTO accounts (email) VALUES ('grace@example.com') RETURNING id`).Scan(&other); err != nil {
		return err
	}
	if err := waitFor(func() bool { return accounts.MayContain(other) }); err != nil {
		return errors.New("another process's account never reached the guard")
	}
	fmt.Println("another process's account reached the guard")

	// Over HTTP the id comes as text, in whatever form the client wrote
	// it: middleware.Parse turns it into the key the guard holds.
	mw, err := middleware.New(accounts, middleware.Parse(middleware.PathValue("id"), uuid.Parse))
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /accounts/{id}", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, err := accounts.Get(r.Context(), uuid.MustParse(r.PathValue("id")))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		fmt.Fprintln(w, a.Email)
	})))
	for _, path := range []string{"/accounts/" + strings.ToUpper(id.String()), "/accounts/" + uuid.NewString()} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		fmt.Printf("GET %s: %d %s", path, rec.Code, rec.Body)
	}
	return nil
}

// waitFor polls ok for up to 30 s.
func waitFor(ok func() bool) error {
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
	}
	return nil
}

// cleanUp removes what run made: the publication and its slots, and the
// table.
func cleanUp(conn *pgx.Conn) {
	ctx := context.Background()
	postgres.Unpublish(ctx, conn, "accounts")
	conn.Exec(ctx, `DROP TABLE IF EXISTS accounts`)
}
