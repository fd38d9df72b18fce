package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// queryRower is what the checks query through: a connection or a
// transaction.
type queryRower interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// relation is a table as the server resolves its name.
type relation struct {
	schema, name string
	oid          uint32
	partitioned  bool // relkind 'p': its rows are its partitions'
}

func (r relation) String() string { return r.schema + "." + r.name }

// ident returns the relation's quoted, schema-qualified name.
func (r relation) ident() string { return pgx.Identifier{r.schema, r.name}.Sanitize() }

// from returns what a query reads the relation's own rows from: a
// partitioned table with its partitions, any other table without the
// tables that inherit from it (whose changes the publication does not
// carry).
func (r relation) from() string {
	if r.partitioned {
		return r.ident()
	}
	return "ONLY " + r.ident()
}

// sanitizeTable returns table as SQL names it: a name with a double quote
// is taken as SQL writes it (`"UserAccounts"`, `app."Users"`); any other
// is taken literally, each dot-separated part quoted ("app.users").
func sanitizeTable(table string) string {
	if strings.Contains(table, `"`) {
		return table
	}
	return pgx.Identifier(strings.Split(table, ".")).Sanitize()
}

// resolve returns table as the server resolves it, through q.
func resolve(ctx context.Context, q queryRower, table string) (relation, error) {
	var r relation
	var kind, path string
	err := q.QueryRow(ctx, `SELECT n.nspname, c.relname, c.oid, c.relkind::text, current_setting('search_path')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1)`, sanitizeTable(table)).Scan(&r.schema, &r.name, &r.oid, &kind, &path)
	if errors.Is(err, pgx.ErrNoRows) {
		var path string
		q.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&path)
		return r, fmt.Errorf("postgres: table %s not found (as %s, with search_path %q)", table, sanitizeTable(table), path)
	}
	if err != nil {
		return r, fmt.Errorf("postgres: find table %s: %w", table, err)
	}
	r.partitioned = kind == "p"
	return r, nil
}

// splitTable returns the schema and the name of table as the server
// resolves it (search_path), through q.
func splitTable(ctx context.Context, q queryRower, table string) (schema, rel string, err error) {
	r, err := resolve(ctx, q, table)
	return r.schema, r.name, err
}

// checkServer returns an error wrapping ErrLogicalUnavailable unless the
// server decodes logically and publishes column lists.
func checkServer(ctx context.Context, conn Conn) error {
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
func checkReplication(ctx context.Context, conn Conn) error {
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

// checkReplicaIdentity returns an error wrapping ErrKeyNotIdentity
// unless r's replica identity is exactly keyColumn's columns (Columns), in
// any order.
func checkReplicaIdentity(ctx context.Context, conn Conn, r relation, keyColumn string) error {
	var ident string
	var cols []string
	err := conn.QueryRow(ctx, `
		SELECT c.relreplident::text,
		       coalesce((SELECT array_agg(a.attname::text ORDER BY a.attname)
		                 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		                 WHERE i.indrelid = c.oid AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END),
		                '{}')
		FROM pg_class c WHERE c.oid = $1`, r.oid).Scan(&ident, &cols)
	if err != nil {
		return fmt.Errorf("postgres: check the replica identity of %s: %w", r, err)
	}
	key := slices.Sorted(slices.Values(columnsOf(keyColumn)))
	if slices.Equal(cols, key) && (ident == "d" || ident == "i") {
		return nil
	}
	how := "REPLICA IDENTITY NOTHING: deletes send no key"
	switch {
	case ident == "f":
		how = "REPLICA IDENTITY FULL: a publication of the key column alone would have to cover every column"
	case ident == "d" && len(cols) == 0:
		how = "no primary key and no REPLICA IDENTITY: deletes send no key"
	case ident == "d" || ident == "i":
		how = fmt.Sprintf("its replica identity is (%s), not (%s): a delete sends only its replica identity's columns, so the follower could not tell which %s it removed",
			strings.Join(cols, ", "), strings.Join(key, ", "), columnList(keyColumn))
	}
	return fmt.Errorf("%w: table %s: %s; follow the columns of the primary key, or ALTER TABLE %s REPLICA IDENTITY USING INDEX on a unique index of %s%s",
		ErrKeyNotIdentity, r, how, r.ident(), strings.Join(key, ", "), columnsHint(keyColumn))
}

// checkPublished returns an error wrapping ErrNotPublished unless the
// publication of r sends exactly what the follower needs and nothing
// less: every insert, update, delete and TRUNCATE of the table, with no
// row filter, its key column alone, and, for a partitioned table, its
// partitions' changes as its own (publish_via_partition_root). A
// publication that sends less would leave the follower "following" with
// holes: the rows a filter or a missing operation kept out of the stream.
func checkPublished(ctx context.Context, q queryRower, r relation, keyColumn string) error {
	pub := publicationName(r.schema, r.name)
	var cols []string
	var filter *string
	var ins, upd, del, trunc, viaRoot bool
	err := q.QueryRow(ctx, `SELECT t.attnames::text[], t.rowfilter, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot
		FROM pg_publication p JOIN pg_publication_tables t ON t.pubname = p.pubname
		WHERE p.pubname = $1 AND t.schemaname = $2 AND t.tablename = $3`,
		pub, r.schema, r.name).Scan(&cols, &filter, &ins, &upd, &del, &trunc, &viaRoot)
	var wrong []string
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: no publication %s of table %s", ErrNotPublished, pub, r)
	case err != nil:
		return fmt.Errorf("postgres: look for the publication: %w", err)
	}
	if key := slices.Sorted(slices.Values(columnsOf(keyColumn))); !slices.Equal(slices.Sorted(slices.Values(cols)), key) {
		wrong = append(wrong, fmt.Sprintf("it sends columns %v, not (%s)", cols, strings.Join(key, ", ")))
	}
	if filter != nil {
		wrong = append(wrong, fmt.Sprintf("it has a row filter, WHERE %s: the rows it keeps out would read absent", *filter))
	}
	var missing []string
	for _, op := range []struct {
		on   bool
		name string
	}{{ins, "insert"}, {upd, "update"}, {del, "delete"}, {trunc, "truncate"}} {
		if !op.on {
			missing = append(missing, op.name)
		}
	}
	if len(missing) > 0 {
		wrong = append(wrong, fmt.Sprintf("it does not publish %s", strings.Join(missing, ", ")))
	}
	if viaRoot != r.partitioned {
		wrong = append(wrong, fmt.Sprintf("publish_via_partition_root is %v, want %v for this table", viaRoot, r.partitioned))
	}
	if len(wrong) > 0 {
		slices.Sort(wrong)
		return fmt.Errorf("%w: publication %s of table %s: %s (drop it, or postgres.Unpublish, and Publish again)",
			ErrNotPublished, pub, r, strings.Join(wrong, "; "))
	}
	return nil
}

// publicationVersion is an SQL expression, of the publication name $1 and
// the table's oid $2, that names the version of everything that decides
// what the stream carries of the table, and in what form: the
// publication's row (its operations, publish_via_partition_root), its
// tables and schemas (each table's column list and row filter), the
// partitions of the table, and its key's forms (keys.go): each key
// column's type and collation (in the order of their attnums), the labels
// of an enum under it (a label renamed is another text for the same rows'
// keys), the version of the
// database's default collation (citext's lower()), and keyFormsVersion.
// Each ALTER PUBLICATION, DROP, CREATE, ATTACH or DETACH PARTITION and
// ALTER TYPE … RENAME VALUE writes a catalog row of another oid or
// transaction id, and the version changes; it never comes back to an
// earlier one. A guard saved, or a stream relayed, under another version
// is read again. It is NULL without the publication.
const publicationVersion = `(SELECT p.oid || '.' || p.xmin
	|| '/' || coalesce((SELECT string_agg(r.oid || '.' || r.xmin, ',' ORDER BY r.oid) FROM pg_publication_rel r WHERE r.prpubid = p.oid), '')
	|| '/' || coalesce((SELECT string_agg(n.oid || '.' || n.xmin, ',' ORDER BY n.oid) FROM pg_publication_namespace n WHERE n.pnpubid = p.oid), '')
	|| '/' || coalesce((SELECT string_agg(i.inhrelid || '.' || i.xmin, ',' ORDER BY i.inhrelid) FROM pg_inherits i
		WHERE i.inhparent IN (SELECT relid FROM pg_partition_tree($2::oid))), '')
	|| '/` + keyFormsVersion + `:' || coalesce((SELECT string_agg(a.atttypid || '.' || a.attcollation
		|| coalesce((WITH RECURSIVE b(oid, depth) AS (SELECT a.atttypid, 0 UNION ALL
				SELECT t.typbasetype, b.depth + 1 FROM b JOIN pg_type t ON t.oid = b.oid WHERE t.typtype = 'd' AND b.depth < 64)
			SELECT '.' || string_agg(e.oid || '.' || e.xmin, ',' ORDER BY e.oid) FROM b JOIN pg_enum e ON e.enumtypid = b.oid), ''), ',' ORDER BY a.attnum)
		FROM pg_publication_rel r JOIN pg_attribute a ON a.attrelid = r.prrelid AND a.attnum = ANY (r.prattrs)
		WHERE r.prpubid = p.oid AND r.prrelid = $2::oid), '')
	|| '.' || coalesce((SELECT pg_database_collation_actual_version(d.oid) FROM pg_database d WHERE d.datname = current_database()), '')
	FROM pg_publication p WHERE p.pubname = $1)`

// identityExpr returns an SQL expression of text that says which table
// a marker or heartbeat vouches for, of the parameters $q, the table's
// name as SQL writes it (sanitizeTable), and $p, the name of its
// publication: the oid the name resolves to as the statement's
// transaction sees it, under the connection's search_path (as resolve
// does; "-" if it names no table), a space, and the version of the
// publication of that table (publicationVersion; "-" without the
// publication) — follow.TableIdentity.String. A rename swap, a DROP and CREATE,
// or a table of the name made earlier in the search_path changes the
// first; a change of what the publication holds, the second
// (Follower.control, and a relayed follower's through follow.Control.Table).
func identityExpr(q, p int) string {
	oid := fmt.Sprintf("to_regclass($%d)", q)
	v := strings.NewReplacer("$1", fmt.Sprintf("$%d", p), "$2::oid", oid+"::oid", "$2", oid+"::oid").Replace(publicationVersion)
	return fmt.Sprintf("coalesce(%s::oid::text, '-') || ' ' || coalesce(%s, '-')", oid, v)
}

// keyFormsVersion names the canonical forms of keyform.go: a change to
// any of them changes it, so that guards and streams of the old forms are
// read again (publicationVersion). "k1" is the first with forms.
const keyFormsVersion = "k2"

// readPublicationVersion returns the version (publicationVersion) of the
// publication of r now.
func readPublicationVersion(ctx context.Context, q queryRower, r relation) (string, error) {
	var v *string
	if err := q.QueryRow(ctx, `SELECT `+publicationVersion, publicationName(r.schema, r.name), r.oid).Scan(&v); err != nil {
		return "", fmt.Errorf("postgres: read the publication's version: %w", err)
	}
	if v == nil {
		return "", fmt.Errorf("%w: no publication %s of table %s", ErrNotPublished, publicationName(r.schema, r.name), r)
	}
	return *v, nil
}

// Resolve returns table as the server resolves it through conn (its
// search_path), as "schema.table": the form of [follow.Start.Tables], by
// which a relay and the followers behind it name a table.
func Resolve(ctx context.Context, conn Conn, table string) (string, error) {
	if ctx == nil || noConn(conn) {
		return "", errors.New("postgres: Resolve needs a context and a connection")
	}
	r, err := resolve(ctx, conn, table)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}
