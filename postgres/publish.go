package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// publicationName returns the name of the publication that Publish
// creates for table rel of schema: "cuckooguard_", the schema and the
// table, with a hash suffix when it must be shortened to 63 bytes.
// Publications belong to a database, so the schema is part of the name.
func publicationName(schema, rel string) string {
	return name("cuckooguard_", schema+"_"+rel)
}

// registry is the table, in the schema of the table followed, where
// followers record when each of their replication slots was last used, for
// [DropStaleSlots].
const registry = "cuckooguard_slots"

// Publish prepares table for the logical-decoding Follower: it checks the
// prerequisites, and creates the publication cuckooguard_<schema>_<table>
// of the key column alone (CREATE PUBLICATION … FOR TABLE table (keyColumn)), so
// that the server decodes and sends nothing else of the table, and the
// small table cuckooguard_slots beside it, where followers note when their
// replication slot was last used. It creates no trigger: the table's
// writers pay nothing but the WAL they write anyway.
//
// Every replica may call it at start-up: calls take turns under an
// advisory lock, and one that finds the publication in place changes
// nothing. The user needs to own the table (CREATE PUBLICATION); the
// followers need the REPLICATION attribute.
//
// It returns an error wrapping [ErrLogicalUnavailable] that names what is
// missing: wal_level = logical, PostgreSQL 15 or later, or a replica
// identity that is exactly the key column (its primary key, or REPLICA
// IDENTITY USING INDEX of a unique index on it). A delete sends only the
// replica identity's columns, so with any other the follower could not
// tell which key a delete removed; and a publication of the key column
// alone must cover the replica identity, or the server refuses the
// table's updates and deletes. A publication of that name for other
// columns is an error too.
func Publish(ctx context.Context, conn *pgx.Conn, table, keyColumn string) error {
	switch {
	case ctx == nil:
		return errors.New("postgres: Publish: ctx is nil")
	case conn == nil:
		return errors.New("postgres: Publish: conn is nil")
	case table == "" || keyColumn == "":
		return errors.New("postgres: Publish needs a table and a key column")
	}
	if err := checkServer(ctx, conn); err != nil {
		return err
	}
	if err := checkReplicaIdentity(ctx, conn, table, keyColumn); err != nil {
		return err
	}
	schema, rel, err := splitTable(ctx, conn, table)
	if err != nil {
		return err
	}
	pub := publicationName(schema, rel)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("postgres: publish: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// Replicas that start together take turns; the second finds the
	// publication in place.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "cuckooguard publish "+pub); err != nil {
		return fmt.Errorf("postgres: publish: %w", err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, pub).Scan(&exists); err != nil {
		return fmt.Errorf("postgres: publish: %w", err)
	}
	if !exists {
		q := fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s (%s)`, pgx.Identifier{pub}.Sanitize(),
			pgx.Identifier{schema, rel}.Sanitize(), pgx.Identifier{keyColumn}.Sanitize())
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("postgres: publish: %w", err)
		}
	}
	q := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
		slot_name text PRIMARY KEY,
		table_name text NOT NULL,
		origin text NOT NULL,
		last_seen timestamptz NOT NULL DEFAULT now())`, pgx.Identifier{schema, registry}.Sanitize())
	if _, err := tx.Exec(ctx, q); err != nil {
		return fmt.Errorf("postgres: publish: create %s: %w", registry, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: publish: %w", err)
	}
	return checkPublished(ctx, conn, table, keyColumn)
}

// splitTable returns the schema and the name of table as the server
// resolves it (search_path), through q.
func splitTable(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string) (schema, rel string, err error) {
	err = q.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1)`, sanitizeTable(table)).Scan(&schema, &rel)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("postgres: table %s not found (search_path?)", table)
	}
	if err != nil {
		return "", "", fmt.Errorf("postgres: find table %s: %w", table, err)
	}
	return schema, rel, nil
}

// checkServer returns an error wrapping ErrLogicalUnavailable unless the
// server decodes logically and publishes column lists.
func checkServer(ctx context.Context, conn *pgx.Conn) error {
	var level string
	var version int
	if err := conn.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('server_version_num')::int`).Scan(&level, &version); err != nil {
		return fmt.Errorf("postgres: check the server: %w", err)
	}
	if version < 150000 {
		return fmt.Errorf("%w: PostgreSQL %d.%d; publications of a column list need 15 or later (or use WithNotify)", ErrLogicalUnavailable, version/10000, version%10000/100)
	}
	if level != "logical" {
		return fmt.Errorf("%w: wal_level is %q; set wal_level = logical and restart the server (or use WithNotify)", ErrLogicalUnavailable, level)
	}
	return nil
}

// checkReplication returns an error wrapping ErrLogicalUnavailable unless
// the connection's user may stream changes.
func checkReplication(ctx context.Context, conn *pgx.Conn) error {
	var user string
	var may bool
	if err := conn.QueryRow(ctx, `SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &may); err != nil {
		return fmt.Errorf("postgres: check the REPLICATION attribute: %w", err)
	}
	if !may {
		return fmt.Errorf("%w: user %q lacks the REPLICATION attribute (ALTER ROLE %s REPLICATION)", ErrLogicalUnavailable, user, pgx.Identifier{user}.Sanitize())
	}
	return nil
}

// checkReplicaIdentity returns an error wrapping ErrLogicalUnavailable
// unless table's replica identity is exactly keyColumn.
func checkReplicaIdentity(ctx context.Context, conn *pgx.Conn, table, keyColumn string) error {
	var ident string
	var cols []string
	err := conn.QueryRow(ctx, `
		SELECT c.relreplident::text,
		       coalesce((SELECT array_agg(a.attname::text ORDER BY a.attname)
		                 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		                 WHERE i.indrelid = c.oid AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END),
		                '{}')
		FROM pg_class c WHERE c.oid = to_regclass($1)`, sanitizeTable(table)).Scan(&ident, &cols)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("postgres: table %s not found (search_path?)", table)
	}
	if err != nil {
		return fmt.Errorf("postgres: check the replica identity of %s: %w", table, err)
	}
	if len(cols) == 1 && cols[0] == keyColumn && (ident == "d" || ident == "i") {
		return nil
	}
	how := "REPLICA IDENTITY NOTHING: deletes send no key"
	switch {
	case ident == "f":
		how = "REPLICA IDENTITY FULL: a publication of the key column alone would have to cover every column"
	case ident == "d" && len(cols) == 0:
		how = "no primary key and no REPLICA IDENTITY: deletes send no key"
	case ident == "d" || ident == "i":
		how = fmt.Sprintf("its replica identity is (%s), not (%s): a delete would send the one, not the key", strings.Join(cols, ", "), keyColumn)
	}
	return fmt.Errorf("%w: table %s: %s; make %q the primary key, or ALTER TABLE %s REPLICA IDENTITY USING INDEX on a unique index of it",
		ErrLogicalUnavailable, table, how, keyColumn, table)
}

// checkPublished returns ErrNotPublished unless the publication of table
// sends exactly its key column.
func checkPublished(ctx context.Context, conn *pgx.Conn, table, keyColumn string) error {
	schema, rel, err := splitTable(ctx, conn, table)
	if err != nil {
		return err
	}
	var cols []string
	pub := publicationName(schema, rel)
	err = conn.QueryRow(ctx, `SELECT attnames::text[] FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`,
		pub, schema, rel).Scan(&cols)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: no publication %s of table %s.%s", ErrNotPublished, pub, schema, rel)
	case err != nil:
		return fmt.Errorf("postgres: look for the publication: %w", err)
	case len(cols) != 1 || cols[0] != keyColumn:
		return fmt.Errorf("%w: publication %s sends columns %v of table %s.%s, not (%s)", ErrNotPublished, pub, cols, schema, rel, keyColumn)
	}
	return nil
}
