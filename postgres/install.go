package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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

// Install prepares table for a [WithNotify] Follower (for logical
// decoding, the default, see [Publish]). It creates or replaces, in one
// transaction, the function and the trigger that publish the changes of
// table's keyColumn (or of the columns of a key of several, [Columns]: the
// [Tuple] of a row's key) on Channel(table), and the sequence that numbers
// the notifications. The trigger costs the table's writers: a transaction
// with a pending notification takes an instance-wide lock at commit. table
// may be schema-qualified ("app.users"). Channels belong to a database,
// not to a schema: give tables of one name in several schemas of one
// database qualified, here and to [NewFollower] alike.
//
// Running Install again is safe, from any number of processes at once (a
// rolling deploy that installs at start-up): installs take turns under an
// advisory lock, and one that finds the trigger installed as it would
// install it changes nothing, so it takes no lock on the table and does
// not wait for the transactions that hold one. Otherwise replacing the
// trigger locks the table against writes; Install gives up with an error
// if it cannot get that lock within 10 seconds, rather than queue every
// query on the table behind it. Like Publish, it returns an error wrapping
// [ErrKeyType] for a key column whose type cannot be followed.
func Install(ctx context.Context, conn Conn, table, keyColumn string) error {
	switch {
	case ctx == nil:
		return errors.New("postgres: Install: ctx is nil")
	case noConn(conn):
		return errors.New("postgres: Install: conn is nil")
	}
	if r, err := resolve(ctx, conn, table); err == nil {
		if err := checkKeyType(ctx, conn, r, keyColumn); err != nil {
			return err
		}
	}
	cols, err := splitColumns(keyColumn)
	if err != nil {
		return err
	}
	tab := sanitizeTable(table)
	key := sanitizeColumns(cols)
	fnName := name("cuckooguard_notify_", strings.ReplaceAll(table, ".", "_"))
	fn := pgx.Identifier{fnName}.Sanitize()
	trgName := name("cuckooguard_", strings.ReplaceAll(table, ".", "_"))
	trg := pgx.Identifier{trgName}.Sanitize()
	body := triggerBody(key, quoteLiteral(Channel(table)))
	if len(cols) > 1 {
		body = tupleTriggerBody(cols, quoteLiteral(Channel(table)))
	}
	// The function prints keys in the settings the follower reads them
	// in, whatever the writing session's (a driver's extra_float_digits
	// of 0, a role's DateStyle): its SET clauses hold while it runs.
	var sets strings.Builder
	config := make([]string, len(outputPins))
	for i, kv := range outputPins {
		fmt.Fprintf(&sets, " SET %s = %s", kv[0], quoteLiteral(kv[1]))
		config[i] = kv[0] + "=" + kv[1]
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("postgres: install: %w", err)
	}
	defer tx.Rollback(ctx)
	// One install at a time: concurrent CREATE OR REPLACE FUNCTIONs fail
	// with "tuple concurrently updated".
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('cuckooguard install'))`); err != nil {
		return fmt.Errorf("postgres: install: lock: %w", err)
	}
	var installed bool
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
		WHERE t.tgrelid = to_regclass($1) AND t.tgname = $2 AND p.proname = $3 AND p.prosrc = $4 AND p.proconfig = $5::text[])`,
		tab, trgName, fnName, body, config).Scan(&installed)
	if err != nil {
		return fmt.Errorf("postgres: install: %w", err)
	}
	if installed {
		return nil // the rollback releases the advisory lock
	}
	stmts := []string{
		`SET LOCAL lock_timeout = '10s'`,
		`CREATE SEQUENCE IF NOT EXISTS cuckooguard_notify_seq`,
		fmt.Sprintf(`CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql%s AS $cg$%s$cg$`, fn, sets.String(), body),
		fmt.Sprintf(`DROP TRIGGER IF EXISTS %s ON %s`, trg, tab),
		fmt.Sprintf(`CREATE TRIGGER %s AFTER INSERT OR DELETE OR UPDATE OF %s ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, trg, key, tab, fn),
	}
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

// triggerBody is the PL/pgSQL source of the trigger function that
// publishes the changes of the key column key (quoted) on the channel ch
// (a quoted literal).
func triggerBody(key, ch string) string {
	return fmt.Sprintf(`
DECLARE
	p text;
	origin text := coalesce(current_setting('cuckooguard.origin', true), '');
	head text := ' ' || txid_current() || ' ' || nextval('cuckooguard_notify_seq') || ' '
		|| floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint || ' '
		|| octet_length(origin) || ':' || origin || ' ';
BEGIN
	IF TG_OP = 'INSERT' THEN
		p := 'I' || head || octet_length(NEW.%[1]s::text) || ':' || NEW.%[1]s::text;
	ELSIF TG_OP = 'DELETE' THEN
		p := 'D' || head || octet_length(OLD.%[1]s::text) || ':' || OLD.%[1]s::text;
	ELSE
		IF NEW.%[1]s IS NOT DISTINCT FROM OLD.%[1]s THEN
			RETURN NULL;
		END IF;
		p := 'U' || head || octet_length(OLD.%[1]s::text) || ':' || OLD.%[1]s::text
			|| ' ' || octet_length(NEW.%[1]s::text) || ':' || NEW.%[1]s::text;
	END IF;
	IF octet_length(p) > %[2]d THEN
		p := 'R' || head || 'resync';
	END IF;
	PERFORM pg_notify(%[3]s, p);
	RETURN NULL;
END
`, key, maxPayload, ch)
}

// tupleTriggerBody is triggerBody for a key of the columns cols (tuple.go):
// the key it publishes is the row's Tuple of the columns' ::text, printed
// in the function's fixed settings, or NULL, no key, if any column is
// NULL. An update that changes any key column, by the columns'
// equalities, publishes the old key's delete and the new key's insert
// (as 'U', or as the one that has a key).
func tupleTriggerBody(cols []string, ch string) string {
	tuple := func(row string) string {
		parts := make([]string, len(cols))
		for i, c := range cols {
			v := row + "." + pgx.Identifier{c}.Sanitize() + "::text"
			parts[i] = "octet_length(" + v + ") || ':' || " + v
		}
		return strings.Join(parts, "\n\t\t|| ")
	}
	row := func(r string) string {
		parts := make([]string, len(cols))
		for i, c := range cols {
			parts[i] = r + "." + pgx.Identifier{c}.Sanitize()
		}
		return "ROW(" + strings.Join(parts, ", ") + ")"
	}
	return fmt.Sprintf(`
DECLARE
	p text;
	k text;
	ok text;
	origin text := coalesce(current_setting('cuckooguard.origin', true), '');
	head text := ' ' || txid_current() || ' ' || nextval('cuckooguard_notify_seq') || ' '
		|| floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint || ' '
		|| octet_length(origin) || ':' || origin || ' ';
BEGIN
	IF TG_OP = 'UPDATE' AND %[4]s IS NOT DISTINCT FROM %[5]s THEN
		RETURN NULL;
	END IF;
	IF TG_OP <> 'DELETE' THEN
		k := %[1]s;
	END IF;
	IF TG_OP <> 'INSERT' THEN
		ok := %[2]s;
	END IF;
	IF k IS NULL AND ok IS NULL THEN
		RETURN NULL;
	ELSIF ok IS NULL THEN
		p := 'I' || head || octet_length(k) || ':' || k;
	ELSIF k IS NULL THEN
		p := 'D' || head || octet_length(ok) || ':' || ok;
	ELSE
		p := 'U' || head || octet_length(ok) || ':' || ok || ' ' || octet_length(k) || ':' || k;
	END IF;
	IF octet_length(p) > %[3]d THEN
		p := 'R' || head || 'resync';
	END IF;
	PERFORM pg_notify(%[6]s, p);
	RETURN NULL;
END
`, tuple("NEW"), tuple("OLD"), maxPayload, row("NEW"), row("OLD"), ch)
}

// checkInstalled returns ErrNotInstalled unless table has an enabled
// trigger whose function notifies Channel(table).
func checkInstalled(ctx context.Context, conn Conn, table string) error {
	var exists, installed bool
	err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
		WHERE t.tgrelid = to_regclass($1) AND t.tgenabled <> 'D' AND position($2 in p.prosrc) > 0)`,
		sanitizeTable(table), "pg_notify("+quoteLiteral(Channel(table))+",").Scan(&exists, &installed)
	switch {
	case err != nil:
		return fmt.Errorf("postgres: follower: look for the trigger: %w", err)
	case !exists:
		return fmt.Errorf("%w: table %s not found (search_path?)", ErrNotInstalled, table)
	case !installed:
		return fmt.Errorf("%w: table %s", ErrNotInstalled, table)
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
