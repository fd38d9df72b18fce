package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strconv"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/mysql"
)

// ExampleFollower keeps a replica's guard in step with the users table of
// a MariaDB server. It needs a server, so it only compiles here.
func ExampleFollower() {
	ctx := context.Background()
	g, err := guard.New()
	if err != nil {
		panic(err)
	}
	store := guarded.GetterFunc[int64, string](func(ctx context.Context, id int64) (string, error) {
		return "", guarded.ErrNotFound // SELECT name FROM users WHERE id = ?
	})
	loader, err := guarded.New(g, store)
	if err != nil {
		panic(err)
	}
	defer loader.Close()
	f, err := mysql.NewFollower(loader, "follower:secret@tcp(db.internal:3306)/shop", "users", "id",
		func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) },
		mysql.WithServerID(4001)) // unique among the server's binlog readers
	if err != nil {
		panic(err)
	}
	go func() {
		// Until ctx ends; returns early only for a setup that cannot work.
		if err := f.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			slog.Error("follower", "error", err)
		}
	}()
	// Handlers call loader.Get(ctx, id): an id the guard has never seen is
	// ErrNotFound without a query, once the follower follows.
}

// ExampleFollower_Tag inserts a row through the Loader, naming its key in
// the transaction, so that the follower does not add it a second time
// when the binlog brings it. It needs a server, so it only compiles here.
func ExampleFollower_Tag() {
	ctx := context.Background()
	var (
		db     *sql.DB                        // sql.Open("mysql", dsn) with a MySQL driver
		loader *guarded.Loader[int64, string] // as in ExampleFollower
		f      *mysql.Follower[int64]         // the Follower of loader
	)
	id, name := int64(42), "Ada"
	err := loader.Insert(ctx, id, func(ctx context.Context) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // after Commit, a no-op
		if _, err := tx.ExecContext(ctx, "INSERT INTO users (id, name) VALUES (?, ?)", id, name); err != nil {
			return err
		}
		if err := f.Tag(ctx, tx, id); err != nil {
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		slog.Error("insert", "error", err)
	}
}

// ExampleWriteToken takes the token of a write and looks its key up under
// it, as another replica would: its Loader answers "absent" only once its
// Follower has applied the write. It needs a server, so it only compiles
// here.
func ExampleWriteToken() {
	ctx := context.Background()
	var (
		db     *sql.DB                        // sql.Open("mysql", dsn) with a MySQL driver
		loader *guarded.Loader[int64, string] // a replica's, kept by a Follower
	)
	if _, err := db.ExecContext(ctx, "INSERT INTO users (id, name) VALUES (?, ?)", 42, "Ada"); err != nil {
		panic(err)
	}
	tok, err := mysql.WriteToken(ctx, db) // after the commit; any connection
	if err != nil {
		// ErrNoToken: the server cannot give one (gtid_strict_mode OFF, or
		// several GTID domains); lookups go on without.
		slog.Warn("no write token", "error", err)
	}
	// The client carries tok.String() to its next request (the
	// middleware's Cuckooguard-Token header); the replica that serves it:
	name, err := loader.Get(guarded.WithToken(ctx, tok), 42)
	_, _ = name, err
}
