package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// publicationName returns the name of the publication that Publish
// creates for table rel of schema: "cuckooguard_", the schema and the
// table, with a hash suffix when it must be shortened to 63 bytes.
// Publications belong to a database, so the schema is part of the name.
func publicationName(schema, rel string) string {
	return name("cuckooguard_", schema+"_"+rel)
}

// registry is the table, in the schema of the table followed unless
// WithRegistry names another, where followers record when each of their
// replication slots was last used, for [DropStaleSlots].
const registry = "cuckooguard_slots"

// Publish prepares table for the logical-decoding Follower: it checks the
// prerequisites, and creates the publication cuckooguard_<schema>_<table>
// of the key column alone (CREATE PUBLICATION … FOR TABLE table
// (keyColumn)), or of the key's columns alone for a key of several
// ([Columns]), so that the server decodes and sends nothing else of the
// table, and the small table cuckooguard_slots beside it, where followers
// note when their replication slot was last used. It creates no trigger:
// the table's writers pay nothing but the WAL they write anyway. A
// partitioned table is published through its root
// (publish_via_partition_root): its partitions' changes reach the
// followers as the table's.
//
// Every replica may call it at start-up. One that finds everything in
// place writes nothing, and needs no privilege beyond reading the
// catalog; calls that create take turns under an advisory lock. Creating
// needs the owner of the table (CREATE PUBLICATION) and the CREATE
// privilege on its schema; the followers need the REPLICATION attribute.
//
// It returns an error wrapping [ErrLogicalUnavailable] that names what the
// server lacks (wal_level = logical, PostgreSQL 15 or later),
// [ErrKeyNotIdentity] for a key column that is not the table's replica
// identity (its primary key, or REPLICA IDENTITY USING INDEX of a unique
// index on it: a delete sends only the replica identity's columns, so the
// follower could not tell which key it removed; the columns of a key of
// several must be all of it, in any order), [ErrKeyType] for a key
// column whose equality the guard cannot hold (a nondeterministic
// collation, say: the error names the type, the collation and what to
// do; the README's "Key types" lists the types), and [ErrNotPublished]
// for a publication of that name that sends other than the follower needs
// (another column list, a row filter, missing operations): Publish does
// not change a publication someone altered, it says how. A publication of
// that name that holds no table of that name, and no schema, is taken
// back: its table was dropped, or renamed away (a DROP TABLE and CREATE
// TABLE, a rename swap), and Publish makes it hold the table the name
// now resolves to (ALTER PUBLICATION … SET TABLE); followers of the old
// table see the change at their next heartbeat and read the new one.
//
// table is a table name as the follower is given it: "users", "app.users"
// (each part taken literally, in any case), or as SQL writes it, with
// double quotes ("\"UserAccounts\""). Of the options only [WithRegistry]
// applies.
func Publish(ctx context.Context, conn Conn, table, keyColumn string, opts ...Option) error {
	c, err := adminConfig("Publish", opts)
	if err != nil {
		return err
	}
	switch {
	case ctx == nil:
		return errors.New("postgres: Publish: ctx is nil")
	case noConn(conn):
		return errors.New("postgres: Publish: conn is nil")
	case table == "" || keyColumn == "":
		return errors.New("postgres: Publish needs a table and a key column")
	}
	cols, err := splitColumns(keyColumn)
	if err != nil {
		return err
	}
	if err := checkServer(ctx, conn); err != nil {
		return err
	}
	r, err := resolve(ctx, conn, table)
	if err != nil {
		return err
	}
	if err := checkReplicaIdentity(ctx, conn, r, keyColumn); err != nil {
		return err
	}
	if err := checkKeyType(ctx, conn, r, keyColumn); err != nil {
		return err
	}
	pub := publicationName(r.schema, r.name)
	var exists, noted bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1), to_regclass($2) IS NOT NULL`,
		pub, c.registryIn(r.schema)).Scan(&exists, &noted); err != nil {
		return fmt.Errorf("postgres: publish: %w", err)
	}
	stale := false
	if exists {
		if stale, err = orphaned(ctx, conn, pub, r); err != nil {
			return err
		}
	}
	if exists && noted && !stale {
		return checkPublished(ctx, conn, r, keyColumn) // in place: write nothing
	}
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
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, pub).Scan(&exists); err != nil {
		return fmt.Errorf("postgres: publish: %w", err)
	}
	if exists {
		if stale, err = orphaned(ctx, tx, pub, r); err != nil {
			return err
		}
	}
	if stale {
		q := fmt.Sprintf(`ALTER PUBLICATION %s SET TABLE %s (%s)`, pgx.Identifier{pub}.Sanitize(), r.ident(), sanitizeColumns(cols))
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("postgres: publish: take back publication %s for %s: %w", pub, r, err)
		}
		q = fmt.Sprintf(`ALTER PUBLICATION %s SET (publish_via_partition_root = %t)`, pgx.Identifier{pub}.Sanitize(), r.partitioned)
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("postgres: publish: take back publication %s for %s: %w", pub, r, err)
		}
	}
	if !exists {
		q := fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s (%s)`, pgx.Identifier{pub}.Sanitize(), r.ident(), sanitizeColumns(cols))
		if r.partitioned {
			q += ` WITH (publish_via_partition_root = true)`
		}
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("postgres: publish: %w", err)
		}
	}
	q := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
		slot_name text PRIMARY KEY,
		table_name text NOT NULL,
		origin text NOT NULL,
		last_seen timestamptz NOT NULL DEFAULT now())`, c.registryIn(r.schema))
	if _, err := tx.Exec(ctx, q); err != nil {
		return fmt.Errorf("postgres: publish: create %s: %w", registry, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: publish: %w", err)
	}
	return checkPublished(ctx, conn, r, keyColumn)
}

// orphaned reports whether publication pub, which exists, is one that
// Publish made for the name of r and whose table is gone from that name:
// it holds no table of r's schema and name, no schema, and is not FOR ALL
// TABLES. Dropping a table leaves its publication empty, and renaming it
// leaves its publication holding it under the new name.
func orphaned(ctx context.Context, q queryRower, pub string, r relation) (bool, error) {
	var orphan bool
	err := q.QueryRow(ctx, `SELECT NOT p.puballtables
		AND NOT EXISTS (SELECT FROM pg_publication_namespace n WHERE n.pnpubid = p.oid)
		AND NOT EXISTS (SELECT FROM pg_publication_rel pr JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace s ON s.oid = c.relnamespace
			WHERE pr.prpubid = p.oid AND s.nspname = $2 AND c.relname = $3)
		FROM pg_publication p WHERE p.pubname = $1`, pub, r.schema, r.name).Scan(&orphan)
	if err != nil {
		return false, fmt.Errorf("postgres: publish: look at publication %s: %w", pub, err)
	}
	return orphan, nil
}
