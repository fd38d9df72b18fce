package postgres

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/internal/tagrec"
)

// Keys of several columns.
//
// A table keyed by (tenant_id, id) is followed as one key of two columns:
// the keyColumn argument of [Publish], [Install], [NewFollower],
// [ReadTable] and a [follow.Table]'s Key name them all, joined by
// [Columns]. Each column keeps its own type's equality (keys.go): a
// tenant's uuid in upper case and its citext id in another case are the
// tenant's key. The guard holds a key of several columns as a [Tuple]:
// the canonical text of each column, in the order Columns names them,
// each prefixed with its length in bytes ("<len>:<text>"). The prefix
// makes the text injective (no separator inside a column's text can make
// two keys one), and each column's canonical form makes it canonical: two
// keys are one text exactly when the database holds them equal, column
// by column.
//
// The key columns must be the table's replica identity, all of it (a
// primary key of those columns, or REPLICA IDENTITY USING INDEX of a
// unique index on them), and so NOT NULL. Through a trigger ([Install],
// which needs no replica identity), a row whose key has a NULL in any
// column has no key in the guard: no lookup can name it, and no query of
// the key's equality finds it (NULL equals nothing). A key of one column
// is its column's text, as before: nothing of a one-column follower
// changes.

// columnSep joins the names of a key's columns (Columns): no identifier
// of PostgreSQL can hold a NUL.
const columnSep = "\x00"

// maxKeyColumns is the most columns a key may have: PostgreSQL's
// INDEX_MAX_KEYS, the most columns of a primary key.
const maxKeyColumns = 32

// Columns returns the key column argument of a key of several columns,
// for [Publish], [Install], [NewFollower], [ReadTable] and a
// [follow.Table]'s Key: postgres.Columns("tenant_id", "id"). Each name is
// a column's name, taken literally, as a one-column key's is. The order
// is the order of the key's [Tuple]. Columns of one name is that name.
func Columns(names ...string) string {
	return strings.Join(names, columnSep)
}

// splitColumns returns the names of the columns of key (Columns), or an
// error for a list no table can have as a key.
func splitColumns(key string) ([]string, error) {
	cols := strings.Split(key, columnSep)
	switch {
	case key == "":
		return nil, errors.New("postgres: no key column")
	case len(cols) > maxKeyColumns:
		return nil, fmt.Errorf("postgres: a key of %d columns: PostgreSQL's keys have at most %d", len(cols), maxKeyColumns)
	}
	for i, c := range cols {
		if c == "" {
			return nil, fmt.Errorf("postgres: key columns %s: column %d has no name", columnList(key), i+1)
		}
		if slices.Contains(cols[:i], c) {
			return nil, fmt.Errorf("postgres: key columns %s: %s twice", columnList(key), pgx.Identifier{c}.Sanitize())
		}
	}
	return cols, nil
}

// columnList returns key (Columns) as the errors name it: a column's
// name, or "(a, b)".
func columnList(key string) string {
	if !strings.Contains(key, columnSep) {
		return key
	}
	return "(" + strings.ReplaceAll(key, columnSep, ", ") + ")"
}

// columnsHint returns what an error about key (Columns) adds for a name
// that looks like a list: "a,b" names one column.
func columnsHint(key string) string {
	if strings.Contains(key, ",") && !strings.Contains(key, columnSep) {
		return " (name the columns of a key of several with postgres.Columns)"
	}
	return ""
}

// sanitizeColumns returns the columns of key (Columns), quoted and
// separated by commas, as a select list or a column list writes them.
func sanitizeColumns(cols []string) string {
	q := make([]string, len(cols))
	for i, c := range cols {
		q[i] = pgx.Identifier{c}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// Tuple is the text of a key of several columns ([Columns]), as the guard
// holds it and the followers parse it: each column's text, in order,
// prefixed with its length in bytes and a colon. TupleOf("7", "alice")
// is "1:75:alice". Use Tuple as the key type of a table keyed by several
// columns ([ParseTuple] is its parse function), or a type of your own
// whose parse function reads [Tuple.Texts] and whose text function
// ([WithKeyText]) writes [TupleOf].
//
// A Tuple given to the Loader may carry each column's text in any form
// the database reads (an upper-case uuid, a citext id in another case,
// 1.50 for 1.5): the key rule the follower installs makes each canonical
// ([Tagger.KeyRule]). One of another number of columns, or a column whose
// text the rule cannot read, is looked up in the store.
type Tuple string

// TupleOf returns the Tuple of texts, one per key column, in the order of
// [Columns].
func TupleOf(texts ...string) Tuple {
	return Tuple(appendTuple(nil, texts))
}

// appendTuple appends the Tuple of texts to b.
func appendTuple(b []byte, texts []string) []byte {
	for _, s := range texts {
		b = tagrec.AppendField(b, s)
	}
	return b
}

// Texts returns the texts of t's columns, or an error for a text that is
// not a Tuple as TupleOf writes it (a length with a sign or a leading
// zero, a length past the end, a text after the last column): each key
// has one Tuple.
func (t Tuple) Texts() ([]string, error) {
	var texts []string
	rest := string(t)
	for rest != "" {
		if len(texts) == maxKeyColumns {
			return nil, fmt.Errorf("postgres: tuple of more than %d columns", maxKeyColumns)
		}
		text, after, err := cutField(rest)
		if err != nil {
			return nil, fmt.Errorf("postgres: tuple column %d: %w", len(texts)+1, err)
		}
		texts = append(texts, text)
		rest = after
	}
	if len(texts) == 0 {
		return nil, errors.New("postgres: empty tuple")
	}
	return texts, nil
}

// cutField cuts the first "<len>:<text>" of s, strictly: len is decimal,
// without a sign or a leading zero.
func cutField(s string) (text, rest string, err error) {
	colon := strings.IndexByte(s, ':')
	if colon < 1 || colon > 9 { // 9 digits: no overflow of a 32-bit int
		return "", "", errors.New("no length")
	}
	digits := s[:colon]
	if digits[0] == '0' && len(digits) > 1 {
		return "", "", errors.New("a length with a leading zero")
	}
	n := 0
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return "", "", fmt.Errorf("length %q is not a number", digits)
		}
		n = n*10 + int(c-'0')
	}
	s = s[colon+1:]
	if n > len(s) {
		return "", "", fmt.Errorf("length %d, past the end", n)
	}
	return s[:n], s[n:], nil
}

// ParseTuple returns text as a Tuple, the parse function of followers
// whose keys are Tuples: an error for a text that is not one.
func ParseTuple(text string) (Tuple, error) {
	if _, err := Tuple(text).Texts(); err != nil {
		return "", err
	}
	return Tuple(text), nil
}

// tupleRule returns the rule of a key of the columns whose rules are
// parts, in order: a key's Tuple is canonical when each column's text is.
func tupleRule(parts []*keyRule) *keyRule {
	typs := make([]string, len(parts))
	for i, p := range parts {
		typs[i] = p.typ
	}
	r := &keyRule{typ: "(" + strings.Join(typs, ", ") + ")", parts: parts}
	r.canon = func(s string) (string, error) { return r.tupleForm(s, false) }
	r.server = func(s string) (string, error) { return r.tupleForm(s, true) }
	return r
}

// tupleForm returns the canonical form of the Tuple text, each column
// made canonical by its rule: by canon, or by server for a text the
// server printed. Its work and its output are bounded as its columns'
// (keyform.go: 3 bytes a byte and 64 for each column), and by the
// prefixes: at most 3·len(text) + 96·len(r.parts) bytes (FuzzTupleForm).
func (r *keyRule) tupleForm(text string, server bool) (string, error) {
	texts, err := Tuple(text).Texts()
	if err != nil {
		return "", err
	}
	if len(texts) != len(r.parts) {
		return "", fmt.Errorf("a key of %d columns, not %d", len(texts), len(r.parts))
	}
	b := make([]byte, 0, len(text))
	for i, p := range r.parts {
		f := p.canon
		if server {
			f = p.server
		}
		s := texts[i]
		if f != nil {
			if s, err = f(s); err != nil {
				return "", fmt.Errorf("column %d, of type %s: %w", i+1, p.typ, err)
			}
		}
		b = tagrec.AppendField(b, s)
	}
	return string(b), nil
}

// keyText returns the key of a row whose key columns' values the server
// printed as raw (a read's row, a change's tuple; nil for NULL), in the
// canonical form of rule, and whether the row has a key: a key of several
// columns with a NULL has none (no lookup can name it, and no query of
// the key's equality finds it). A one-column key is its text, as before.
func keyText(rule *keyRule, raw [][]byte) (string, bool, error) {
	if len(raw) == 1 {
		s, err := rule.fromServer(string(raw[0]))
		return s, true, err
	}
	var b []byte
	for _, v := range raw {
		if v == nil {
			return "", false, nil
		}
		b = tagrec.AppendField(b, string(v))
	}
	s, err := rule.fromServer(string(b))
	return s, true, err
}

// columnsOf returns the names of the columns of key, a key column
// argument ([Columns]): one name for a key of one column.
func columnsOf(key string) []string {
	return strings.Split(key, columnSep)
}
