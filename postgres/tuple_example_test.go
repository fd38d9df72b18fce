package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// A key of two columns is held as its Tuple: each column's text with its
// length before it, so that no text inside a column can make two keys
// one.
func ExampleTupleOf() {
	k := postgres.TupleOf("7", "alice@example.com")
	fmt.Println(k)
	texts, err := k.Texts()
	fmt.Println(texts, err)
	fmt.Println(postgres.TupleOf("1:2", "3") == postgres.TupleOf("1", "2", "3"))
	// Output:
	// 1:717:alice@example.com
	// [7 alice@example.com] <nil>
	// false
}

// A multi-tenant table keyed by (tenant_id, id): the guard holds each
// tenant's keys, and the same id under another tenant reads absent. This
// example needs a PostgreSQL server, so it is only compiled.
func ExampleColumns() {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL")
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	key := postgres.Columns("tenant_id", "id") // the table's primary key
	conn, err := pool.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	err = postgres.Publish(ctx, conn.Conn(), "members", key)
	conn.Release()
	if err != nil {
		log.Fatal(err)
	}
	g, err := guard.New()
	if err != nil {
		log.Fatal(err)
	}
	members, err := guarded.New(g, guarded.GetterFunc[postgres.Tuple, string](func(ctx context.Context, k postgres.Tuple) (string, error) {
		texts, err := k.Texts() // each column's canonical text, in the order of key
		if err != nil || len(texts) != 2 {
			return "", fmt.Errorf("not a member key: %q", k)
		}
		var name string
		err = pool.QueryRow(ctx, `SELECT name FROM members WHERE tenant_id = $1 AND id = $2`, texts[0], texts[1]).Scan(&name)
		return name, err
	}), guarded.WithNotFound(func(err error) bool { return errors.Is(err, pgx.ErrNoRows) }))
	if err != nil {
		log.Fatal(err)
	}
	defer members.Close()
	f, err := postgres.NewFollower(members, dsn, "members", key, postgres.ParseTuple, postgres.WithOrigin("replica-1"))
	if err != nil {
		log.Fatal(err)
	}
	go f.Run(ctx)
	// Each column in any form the database reads: an upper-case uuid in
	// braces, a citext id in another case.
	name, err := members.Get(ctx, postgres.TupleOf("{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}", "Alice@Example.com"))
	fmt.Println(name, err)
}
