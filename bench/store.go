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

// openSQL opens the users table and makes it hold users 1..rows,
// reporting seeding progress; a table from an earlier run with those rows
// is reused as it is (reused).
func openSQL(ctx context.Context, dsn string, rows int64, progress func(done int64)) (_ sqlStore, reused bool, err error) {
	db, err := userdb.Open(ctx, dsn)
	if err != nil {
		return sqlStore{}, false, err
	}
	if err := db.Migrate(ctx); err != nil {
		db.Close()
		return sqlStore{}, false, err
	}
	if reused, err = db.SeedExactly(ctx, rows, progress); err != nil {
		db.Close()
		return sqlStore{}, false, err
	}
	return sqlStore{db}, reused, nil
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
