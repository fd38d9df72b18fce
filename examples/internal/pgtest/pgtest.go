// Package pgtest gives the examples' tests a PostgreSQL schema of their
// own, when CUCKOOGUARD_PG_DSN names a server (.ci/run starts one).
package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/postgres"
	"github.com/jackc/pgx/v5"
)

// DSN returns CUCKOOGUARD_PG_DSN, or skips the test if it is not set.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("CUCKOOGUARD_PG_DSN")
	if dsn == "" {
		t.Skip("set CUCKOOGUARD_PG_DSN=postgres://user@127.0.0.1:5432/db to run against PostgreSQL (.ci/run starts one)")
	}
	return dsn
}

// Schema creates a schema of its own for the test on the server that dsn
// names, and returns a DSN whose connections use it; the schema is
// dropped at the end of the test.
func Schema(t testing.TB, dsn string) string {
	t.Helper()
	ctx := context.Background()
	admin, err := userdb.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := "t_" + strings.ToLower(strings.NewReplacer("/", "_", "-", "_").Replace(t.Name())) + fmt.Sprintf("_%d", time.Now().UnixNano()%1e6)
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The followers' replication slots and the publication belong to
		// the database, not the schema: a slot left behind holds WAL.
		unpublish(t, dsn, schema+".users")
		admin.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// unpublish undoes postgres.Publish for table, if it exists.
func unpublish(t testing.TB, dsn, table string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer c.Close(ctx)
	var exists bool
	if err := c.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
		return
	}
	if err := postgres.Unpublish(ctx, c, table); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}
