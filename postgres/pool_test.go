package postgres

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestAdminThroughPool runs the administrative functions with what a pgx
// user holds, a pool: Publish, Resolve, IdentifyDatabase, Slots and
// Unpublish, and Publish again with a pool through which it finds
// everything in place.
func TestAdminThroughPool(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 10)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := Publish(ctx, pool, "users", "id"); err != nil {
		t.Fatalf("Publish through a pool: %v", err)
	}
	if err := Publish(ctx, pool, "users", "id"); err != nil {
		t.Fatalf("Publish again through a pool: %v", err)
	}
	name, err := Resolve(ctx, pool, "users")
	if err != nil {
		t.Fatal(err)
	}
	db, err := IdentifyDatabase(ctx, pool)
	if err != nil || db.IsZero() {
		t.Fatalf("IdentifyDatabase = %v, %v", db, err)
	}
	if _, err := Slots(ctx, pool, "users"); err != nil {
		t.Fatal(err)
	}
	if err := Unpublish(ctx, pool, "users"); err != nil {
		t.Fatalf("Unpublish through a pool: %v", err)
	}
	schema, rel, _ := strings.Cut(name, ".")
	var pubs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, publicationName(schema, rel)).Scan(&pubs); err != nil || pubs != 0 {
		t.Fatalf("%d publications of %s left after Unpublish (%v)", pubs, name, err)
	}
	var nilPool *pgxpool.Pool
	if err := Publish(ctx, nilPool, "users", "id"); err == nil {
		t.Fatal("Publish with a nil pool: no error")
	}
}
