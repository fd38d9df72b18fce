package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// The guard answers "absent" only for a key that no row's key equals
// under the key column's own equality: its type's, with its collation.
// Where that equality is the text's (text and varchar of a deterministic
// collation, enums), keys go to the guard as the server prints them.
// Where two texts are one key to the database (character(n) padding,
// citext case, numeric scale, -0 and 0, one instant in two time zones,
// one span in two units), every path makes the key canonical (keyform.go)
// before it reaches the guard: the full read, the change stream (a
// Follower's and a Source's, and so the relay's), the NOTIFY trigger's
// payloads, the Loader's own tagged inserts ([Tagger.Tag] refuses a key
// in another form) and the lookups ([Follower.Key]). Types whose equality
// the guard cannot reproduce (a nondeterministic collation, citext under
// an ICU database default, and the types not listed in keyRuleFor) are
// refused, by Publish and by every follower, with ErrKeyType.

// keyRule is how the guard holds the keys of one key column.
type keyRule struct {
	typ string // the column's type, as the errors name it
	// canon returns the canonical form of any text the server reads as a
	// value of the type, or an error where it cannot tell which value
	// (keyform.go); nil: every text is its own form.
	canon func(string) (string, error)
	// server returns the canonical form of a text the server printed
	// (the read, the stream, ::text); nil: such a text is canonical.
	server func(string) (string, error)
	// lower is citext's map, and lowerOf what it depends on (the
	// database's ctype and its version): a rule read again reuses it.
	lower   *lowerMap
	lowerOf string
	// parts are the rules of the columns of a key of several (tuple.go),
	// in order; nil for a key of one column.
	parts []*keyRule
}

// Key, Trivial and Type make a keyRule a follow.KeyForm.
func (r *keyRule) Key(text string) (string, error) { return r.key(text) }
func (r *keyRule) Trivial() bool                   { return r.canon == nil }
func (r *keyRule) Type() string                    { return r.typ }

// key returns the canonical form of text, a key written in any form the
// database reads.
func (r *keyRule) key(text string) (string, error) {
	if r.canon == nil {
		return text, nil
	}
	s, err := r.canon(text)
	if err != nil {
		return "", fmt.Errorf("postgres: key of type %s: %w", r.typ, err)
	}
	return s, nil
}

// fromServer returns the canonical form of text, a key the server printed.
// An error here is a form of the server's output that keyform.go does not
// know: the session fails, and the Loader passes lookups through.
func (r *keyRule) fromServer(text string) (string, error) {
	if r == nil || r.server == nil {
		return text, nil
	}
	s, err := r.server(text)
	if err != nil {
		return "", fmt.Errorf("postgres: the server printed a key of type %s that the follower cannot read: %w", r.typ, err)
	}
	return s, nil
}

// keyColumn is what the catalog says of a key column.
type keyColumn struct {
	typ                   string // format_type of the column, and its base type's if it is a domain
	sqlType               string // what ALTER COLUMN … TYPE would name for it: its type or its domain's base type
	base, schema, typtype string // its type's, through any domains
	citext                bool   // the base type is the citext extension's
	coll, provider        string // its collation, "" for none
	deterministic         bool
}

// readKeyRule reads the type of r's keyColumn through q and returns its
// rule, or an error wrapping ErrKeyType. params are the startup
// parameters of the connections whose output the rule reads (nil for
// none): a DSN that sets DateStyle, IntervalStyle or extra_float_digits
// to a form keyform.go does not read is refused. prev, the rule read
// before (or nil), lends its citext map if the database's ctype is the
// same: reading the map asks the server for lower() of every code point,
// a quarter of a second of its time.
func readKeyRule(ctx context.Context, q queryRower, r relation, key string, params map[string]string, prev *keyRule) (*keyRule, error) {
	return keyRuleOf(ctx, q, r, key, params, prev, true)
}

// checkKeyType returns an error wrapping ErrKeyType if the type of r's
// keyColumn cannot be followed, as readKeyRule would, without reading
// what its forms need (citext's lower() of every code point).
func checkKeyType(ctx context.Context, q queryRower, r relation, key string) error {
	_, err := keyRuleOf(ctx, q, r, key, nil, nil, false)
	return err
}

// keyRuleOf is readKeyRule; without forms, the rule it returns only says
// that the type can be followed.
func keyRuleOf(ctx context.Context, q queryRower, r relation, key string, params map[string]string, prev *keyRule, forms bool) (*keyRule, error) {
	cols, err := splitColumns(key)
	if err != nil {
		return nil, err
	}
	if len(cols) == 1 {
		return columnRuleOf(ctx, q, r, key, params, prev, forms)
	}
	parts := make([]*keyRule, len(cols))
	for i, col := range cols {
		var was *keyRule
		if prev != nil && len(prev.parts) == len(cols) {
			was = prev.parts[i]
		}
		for _, p := range parts[:i] {
			if p.lower != nil && (was == nil || was.lower == nil) {
				was = p // a second citext column borrows the first's map
			}
		}
		if parts[i], err = columnRuleOf(ctx, q, r, col, params, was, forms); err != nil {
			return nil, err
		}
	}
	return tupleRule(parts), nil
}

// columnRuleOf is keyRuleOf for one column.
func columnRuleOf(ctx context.Context, q queryRower, r relation, key string, params map[string]string, prev *keyRule, forms bool) (*keyRule, error) {
	var c keyColumn
	var typid uint32
	err := q.QueryRow(ctx, `SELECT format_type(a.atttypid, a.atttypmod), a.atttypid,
			coalesce(c.collname::text, ''), coalesce(c.collprovider::text, ''), coalesce(c.collisdeterministic, true)
		FROM pg_attribute a LEFT JOIN pg_collation c ON c.oid = a.attcollation
		WHERE a.attrelid = $1 AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped`,
		r.oid, key).Scan(&c.typ, &typid, &c.coll, &c.provider, &c.deterministic)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("postgres: table %s has no column %s%s", r, pgx.Identifier{key}.Sanitize(), columnsHint(key))
	}
	if err != nil {
		return nil, fmt.Errorf("postgres: read the type of key column %s of %s: %w", key, r, err)
	}
	var baseName string
	var depth int
	err = q.QueryRow(ctx, `WITH RECURSIVE chain(oid, depth) AS (
			SELECT $1::oid, 0
			UNION ALL
			SELECT t.typbasetype, c.depth + 1 FROM chain c JOIN pg_type t ON t.oid = c.oid WHERE t.typtype = 'd' AND c.depth < 64)
		SELECT c.depth, n.nspname::text, t.typname::text, t.typtype::text, format_type(t.oid, NULL),
			EXISTS (SELECT FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
				WHERE d.classid = 'pg_type'::regclass AND d.objid = t.oid AND d.refclassid = 'pg_extension'::regclass AND e.extname = 'citext')
		FROM chain c JOIN pg_type t ON t.oid = c.oid JOIN pg_namespace n ON n.oid = t.typnamespace
		ORDER BY c.depth DESC LIMIT 1`, typid).Scan(&depth, &c.schema, &c.base, &c.typtype, &baseName, &c.citext)
	if err != nil {
		return nil, fmt.Errorf("postgres: read the type of key column %s of %s: %w", key, r, err)
	}
	c.sqlType = c.typ
	if depth > 0 {
		c.typ += ", a domain over " + baseName
		c.sqlType = baseName
	}
	refuse := func(cause, fix string) error {
		return fmt.Errorf("%w: key column %s of table %s: %s %s; %s", ErrKeyType, pgx.Identifier{key}.Sanitize(), r, c.typ, cause, fix)
	}
	var lower *lowerMap
	var lowerOf string
	if c.citext {
		var provider, locale, encoding string
		if err := q.QueryRow(ctx, `SELECT datlocprovider::text, coalesce(daticulocale, ''), pg_encoding_to_char(encoding),
				datctype || ' ' || coalesce(pg_database_collation_actual_version(oid), '')
			FROM pg_database WHERE datname = current_database()`).Scan(&provider, &locale, &encoding, &lowerOf); err != nil {
			return nil, fmt.Errorf("postgres: read the database's default collation: %w", err)
		}
		switch {
		case provider == "i":
			return nil, refuse(fmt.Sprintf("compares lower() under the database's default collation, ICU locale %q, whose case mapping depends on the letters around each one (a final sigma), which the guard cannot reproduce", locale),
				fmt.Sprintf("store the key lower-cased in a text column (CHECK (%[1]s = lower(%[1]s))) and look keys up lower-cased", pgx.Identifier{key}.Sanitize()))
		case encoding != "UTF8":
			return nil, refuse(fmt.Sprintf("in a database of encoding %s", encoding), "follow citext keys in a UTF8 database, or store the key lower-cased in a text column")
		}
		switch {
		case !forms:
			return &keyRule{typ: c.typ}, nil
		case prev != nil && prev.lower != nil && prev.lowerOf == lowerOf:
			lower = prev.lower
		default:
			if lower, err = readLowerMap(ctx, q); err != nil {
				return nil, err
			}
		}
	}
	rule, err := keyRuleFor(c, params, lower)
	if err != nil {
		return nil, refuse(err.Error(), fixOf(c, r, key))
	}
	rule.typ, rule.lower, rule.lowerOf = c.typ, lower, lowerOf
	return rule, nil
}

// keyRuleFor returns the rule of a column c (lower: the citext map), or
// the cause of its refusal.
func keyRuleFor(c keyColumn, params map[string]string, lower *lowerMap) (*keyRule, error) {
	if c.typtype == "e" {
		return &keyRule{}, nil // an enum's label is its only text
	}
	if c.citext {
		return &keyRule{canon: lower.canon, server: lower.canon}, nil
	}
	collated := func() error {
		if c.deterministic {
			return nil
		}
		kind := map[string]string{"i": "ICU", "c": "libc"}[c.provider]
		return fmt.Errorf("with the nondeterministic %s collation %q: texts the database holds equal (in case, accents or their encoding) are different keys to the guard", kind, c.coll)
	}
	setting := func(name string, ok func(string) bool) error {
		if v, set := param(params, name); set && !ok(v) {
			return fmt.Errorf("printed with %s = %q, set by the follower's DSN, in a form the follower does not read", name, v)
		}
		return nil
	}
	both := func(f func(string) (string, error)) *keyRule { return &keyRule{canon: f, server: f} }
	if c.schema != "pg_catalog" {
		return nil, errors.New("is not a type whose equality the guard knows")
	}
	switch c.base {
	case "int2":
		return &keyRule{canon: canonInt(16)}, nil
	case "int4":
		return &keyRule{canon: canonInt(32)}, nil
	case "int8":
		return &keyRule{canon: canonInt(64)}, nil
	case "text", "varchar":
		if err := collated(); err != nil {
			return nil, err
		}
		return &keyRule{}, nil
	case "bpchar":
		if err := collated(); err != nil {
			return nil, err
		}
		return both(canonBpchar), nil
	case "numeric":
		return both(canonNumeric), nil
	case "float4", "float8":
		if err := setting("extra_float_digits", func(v string) bool { n, err := strconv.Atoi(v); return err == nil && n >= 1 }); err != nil {
			return nil, err
		}
		if c.base == "float4" {
			return both(canonFloat(32)), nil
		}
		return both(canonFloat(64)), nil
	case "date", "timestamp", "timestamptz":
		if err := setting("DateStyle", func(v string) bool { return strings.HasPrefix(strings.ToUpper(strings.TrimSpace(v)), "ISO") }); err != nil {
			return nil, err
		}
		kind := map[string]timeKind{"date": kindDate, "timestamp": kindTimestamp, "timestamptz": kindTimestamptz}[c.base]
		return both(canonTime(kind)), nil
	case "interval":
		if err := setting("IntervalStyle", func(v string) bool { return strings.EqualFold(strings.TrimSpace(v), "postgres") }); err != nil {
			return nil, err
		}
		return &keyRule{canon: keyInterval, server: canonInterval}, nil
	case "inet":
		return &keyRule{canon: canonInet(false), server: inetFromServer}, nil
	case "cidr":
		return &keyRule{canon: canonInet(true)}, nil
	case "bytea":
		return both(canonBytea), nil
	case "uuid":
		return &keyRule{canon: canonUUID}, nil
	}
	return nil, errors.New("is not a type whose equality the guard knows")
}

// KeyTypes lists the key column types the followers take, as the errors
// of ErrKeyType name them; domains over them are taken too.
const KeyTypes = "smallint, integer, bigint, text and character varying (of a deterministic collation), character(n), citext, numeric, real, double precision, date, timestamp, timestamp with time zone, interval, inet, cidr, bytea, uuid and enums"

// fixOf returns what to do about the refused column c.
func fixOf(c keyColumn, r relation, key string) string {
	col := pgx.Identifier{key}.Sanitize()
	switch {
	case !c.deterministic && (c.base == "text" || c.base == "varchar" || c.base == "bpchar"):
		return fmt.Sprintf("follow a key column of a deterministic collation (ALTER TABLE %s ALTER COLUMN %s TYPE %s COLLATE \"default\", with the publication dropped first), and keep one form per key, such as lower-case (CHECK (%[2]s = lower(%[2]s)))",
			r.ident(), col, c.sqlType)
	case c.schema == "pg_catalog" && (c.base == "float4" || c.base == "float8" || c.base == "date" || c.base == "timestamp" || c.base == "timestamptz" || c.base == "interval"):
		return "remove the setting from the DSN: the follower pins the forms it reads"
	}
	return "the guard knows the equality of " + KeyTypes + ", and of domains over them: follow a key column of one of those"
}

// param returns the startup parameter k of params (any case).
func param(params map[string]string, k string) (string, bool) {
	for set, v := range params {
		if strings.EqualFold(set, k) {
			return v, true
		}
	}
	return "", false
}

// readLowerMap reads, through q, what lower() does to each code point
// under the database's default collation: citext's equality.
func readLowerMap(ctx context.Context, q queryRower) (*lowerMap, error) {
	var cps []int32
	var lows []string
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(cp ORDER BY cp), '{}'), coalesce(array_agg(l ORDER BY cp), '{}') FROM (
			SELECT cp, lower(chr(cp) COLLATE "default") AS l FROM generate_series(1, 1114111) cp
			WHERE cp NOT BETWEEN 55296 AND 57343) m
		WHERE l <> chr(cp)`).Scan(&cps, &lows)
	if err != nil {
		return nil, fmt.Errorf("postgres: read lower() of the database's default collation: %w", err)
	}
	m := &lowerMap{runes: make(map[rune]string, len(cps))}
	for c := range m.keep {
		m.keep[c] = true
	}
	for i, cp := range cps {
		m.runes[rune(cp)] = lows[i]
		if cp < utf8.RuneSelf {
			m.keep[cp] = false
		}
	}
	return m, nil
}
