package main

import (
	"context"
	"database/sql"
	"fmt"
	"iter"
	"sync/atomic"
	"time"

	"github.com/cuckooguard/cuckooguard/examples/userdb"
)

// store is what the load test looks users up in.
type store interface {
	Lookup(ctx context.Context, id int64) (userdb.User, error)
	IDs(ctx context.Context) iter.Seq2[int64, error]
	Queries() int64 // lookups run so far
	Close() error
}

// sqlStore is a users table in SQLite or PostgreSQL.
type sqlStore struct{ *userdb.DB }

func (s sqlStore) Queries() int64 { return s.Lookups.Load() }

// openSQL opens and seeds the users table, reporting seeding progress.
func openSQL(ctx context.Context, dsn string, rows int64, progress func(done int64)) (sqlStore, error) {
	db, err := userdb.Open(ctx, dsn)
	if err != nil {
		return sqlStore{}, err
	}
	if err := db.Migrate(ctx); err != nil {
		db.Close()
		return sqlStore{}, err
	}
	// A table from an earlier run with the same rows is reused as it is.
	var n, maxID sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), MAX(id) FROM users`).Scan(&n, &maxID); err != nil {
		db.Close()
		return sqlStore{}, fmt.Errorf("count users: %w", err)
	}
	if n.Int64 != rows || maxID.Int64 != rows {
		if _, err := db.ExecContext(ctx, `DELETE FROM users WHERE id > $1 OR id < 1`, rows); err != nil {
			db.Close()
			return sqlStore{}, err
		}
		if err := db.Seed(ctx, rows, progress); err != nil {
			db.Close()
			return sqlStore{}, err
		}
	} else if progress != nil {
		progress(rows)
	}
	return sqlStore{db}, nil
}

// simStore holds users 1..rows in memory and waits latency per lookup,
// like a database on the network.
type simStore struct {
	rows    int64
	latency time.Duration
	queries atomic.Int64
}

func (s *simStore) Lookup(ctx context.Context, id int64) (userdb.User, error) {
	s.queries.Add(1)
	if s.latency > 0 {
		t := time.NewTimer(s.latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return userdb.User{}, ctx.Err()
		}
	}
	if id < 1 || id > s.rows {
		return userdb.User{}, fmt.Errorf("sim: user %d: %w", id, sql.ErrNoRows)
	}
	return userdb.User{ID: id, Name: "user"}, nil
}

func (s *simStore) IDs(ctx context.Context) iter.Seq2[int64, error] {
	return func(yield func(int64, error) bool) {
		for id := int64(1); id <= s.rows; id++ {
			if !yield(id, nil) {
				return
			}
		}
	}
}

func (s *simStore) Queries() int64 { return s.queries.Load() }
func (s *simStore) Close() error   { return nil }
