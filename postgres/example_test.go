package postgres_test

import (
	"context"
	"errors"
	"log"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// Each replica of a service follows the users table, so that rows other
// replicas create are found here too, and tags its own writes. This
// example needs a PostgreSQL server, so it is only compiled.
func ExampleFollower() {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL")
	replica, _ := os.Hostname()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// The publication of the key column, from every replica alike (the
	// server needs wal_level = logical, the user REPLICATION).
	conn, err := pool.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if err := postgres.Publish(ctx, conn.Conn(), "users", "id"); err != nil {
		log.Fatal(err)
	}
	conn.Release()

	lookup := func(ctx context.Context, id int64) (string, error) {
		var name string
		err := pool.QueryRow(ctx, `SELECT name FROM users WHERE id = $1`, id).Scan(&name)
		return name, err
	}
	g, err := guard.New(guard.WithCapacity(1_000_000))
	if err != nil {
		log.Fatal(err)
	}
	loader, err := guarded.New(g, guarded.GetterFunc[int64, string](lookup),
		guarded.WithNotFound(func(err error) bool { return errors.Is(err, pgx.ErrNoRows) }))
	if err != nil {
		log.Fatal(err)
	}
	defer loader.Close()
	parse := func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
	f, err := postgres.NewFollower(loader, dsn, "users", "id", parse,
		postgres.WithOrigin(replica), // the same across restarts, unique among the replicas running
		postgres.WithSnapshotFile("/var/lib/users-api/users.guard"))
	if err != nil {
		log.Fatal(err)
	}
	// Run resyncs, then applies notifications until ctx ends; lookups
	// pass through until the first resync is done. It returns early only
	// for a setup that cannot work: say so.
	go func() {
		if err := f.Run(ctx); err != nil && ctx.Err() == nil {
			log.Printf("follower: %v", err)
		}
	}()

	// This replica's inserts go through the Loader, and their
	// transactions name the key the Loader added: the follower skips
	// that insert, and applies any other row the transaction writes.
	err = loader.Insert(ctx, 42, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := f.Tag(ctx, tx, 42); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO users (id, name) VALUES (42, 'Ada')`)
			return err
		})
	})
	if err != nil {
		log.Fatal(err)
	}
}
