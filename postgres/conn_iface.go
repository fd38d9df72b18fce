package postgres

import (
	"context"
	"reflect"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conn is what the administrative functions take ([Publish], [Unpublish],
// [Install], [Slots], [DropStaleSlots], [Resolve], [IdentifyDatabase]):
// whatever a pgx user holds, a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
// Each call that writes runs in a transaction of its own (a savepoint in a
// pgx.Tx), so a pool lends it one connection at a time; none needs a
// session's state between calls, so a transaction-pooling PgBouncer in
// front of a pool is fine for them (not for a follower's own connections).
type Conn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// noConn reports whether c is nil, or a nil pointer in an interface.
func noConn(c Conn) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
