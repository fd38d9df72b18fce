package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// maxPayload is the largest notification payload Install sends with a key;
// PostgreSQL's limit is 8000 bytes.
const maxPayload = 7900

// Channel returns the notification channel of table: "cuckooguard_" and
// the table name, or, for a name that would not fit PostgreSQL's 63-byte
// identifiers, a hash of it.
func Channel(table string) string {
	return name("cuckooguard_", table)
}

// name returns prefix+s if it fits in an identifier, else prefix and a
// hash of s.
func name(prefix, s string) string {
	if n := prefix + s; len(n) <= 63 {
		return n
	}
	h := sha256.Sum256([]byte(s))
	return prefix + hex.EncodeToString(h[:12])
}

// Install creates or replaces, in one transaction, the function and the
// trigger that publish the changes of table's keyColumn on
// Channel(table), and the sequence that numbers the notifications. table
// may be schema-qualified ("app.users"). Running Install again is safe.
func Install(ctx context.Context, conn *pgx.Conn, table, keyColumn string) error {
	tab := sanitizeTable(table)
	key := pgx.Identifier{keyColumn}.Sanitize()
	fn := pgx.Identifier{name("cuckooguard_notify_", strings.ReplaceAll(table, ".", "_"))}.Sanitize()
	trg := pgx.Identifier{name("cuckooguard_", strings.ReplaceAll(table, ".", "_"))}.Sanitize()
	ch := Channel(table)
	stmts := []string{
		`CREATE SEQUENCE IF NOT EXISTS cuckooguard_notify_seq`,
		fmt.Sprintf(`CREATE OR REPLACE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $cg$
DECLARE
	p text;
	origin text := coalesce(current_setting('cuckooguard.origin', true), '');
	head text := ' ' || txid_current() || ' ' || nextval('cuckooguard_notify_seq') || ' '
		|| floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint || ' '
		|| octet_length(origin) || ':' || origin || ' ';
BEGIN
	IF TG_OP = 'INSERT' THEN
		p := 'I' || head || octet_length(NEW.%[2]s::text) || ':' || NEW.%[2]s::text;
	ELSIF TG_OP = 'DELETE' THEN
		p := 'D' || head || octet_length(OLD.%[2]s::text) || ':' || OLD.%[2]s::text;
	ELSE
		IF NEW.%[2]s IS NOT DISTINCT FROM OLD.%[2]s THEN
			RETURN NULL;
		END IF;
		p := 'U' || head || octet_length(OLD.%[2]s::text) || ':' || OLD.%[2]s::text
			|| ' ' || octet_length(NEW.%[2]s::text) || ':' || NEW.%[2]s::text;
	END IF;
	IF octet_length(p) > %[3]d THEN
		p := 'R' || head || 'resync';
	END IF;
	PERFORM pg_notify(%[4]s, p);
	RETURN NULL;
END
$cg$`, fn, key, maxPayload, quoteLiteral(ch)),
		fmt.Sprintf(`DROP TRIGGER IF EXISTS %s ON %s`, trg, tab),
		fmt.Sprintf(`CREATE TRIGGER %s AFTER INSERT OR DELETE OR UPDATE OF %s ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, trg, key, tab, fn),
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("postgres: install: %w", err)
	}
	defer tx.Rollback(ctx)
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("postgres: install trigger on %s: %w", table, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: install: %w", err)
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// TagOrigin marks the writes of transaction tx as made by origin (a
// replica's id), for the rest of tx: the notifications they cause carry
// it, and the follower of that replica skips the inserts among them,
// because its own guard.Loader added their keys before writing. Tag only
// transactions that run inside [guard.Loader.Insert] or
// [guard.Loader.Delete]: a tagged insert made around the Loader would be
// missing from this replica's guard. An untagged write through the Loader
// costs only an extra copy of its key (a false positive). With database/sql, run the same
// statement in the transaction: SELECT set_config('cuckooguard.origin', $1, true).
func TagOrigin(ctx context.Context, tx pgx.Tx, origin string) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('cuckooguard.origin', $1, true)`, origin); err != nil {
		return fmt.Errorf("postgres: tag origin: %w", err)
	}
	return nil
}

// sanitizeTable quotes a possibly schema-qualified table name.
func sanitizeTable(table string) string {
	return pgx.Identifier(strings.Split(table, ".")).Sanitize()
}
