package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/jackc/pgx/v5"
)

// A tagger is a Follower's follow.Tagger, with what PostgreSQL adds: the
// statement that writes a tag (a logical decoding message, or with
// WithNotify the setting the trigger reads), and where the key column's
// forms are read.
type tagger[K comparable] struct {
	*follow.Tagger[K]
	notify bool    // tags go to the setting the NOTIFY trigger reads
	col    *column // where the forms are read; nil: nowhere
}

// newTagger returns the tagger of a run of the follower named origin
// (any name; "" is fine), whose keys read back from their text with parse
// and are written as text by text (nil: the default of [WithKeyText]).
func newTagger[K comparable](origin string, parse func(string) (K, error), text func(K) string) (*tagger[K], error) {
	if parse == nil {
		return nil, errors.New("postgres: NewFollower needs a parse function")
	}
	t, err := follow.NewTagger(origin, parse, text)
	if err != nil {
		return nil, err
	}
	return &tagger[K]{Tagger: t}, nil
}

// Tag names, in transaction tx, the keys it creates on behalf of the
// follower's Loader (see [Follower.Tag]).
func (t *tagger[K]) Tag(ctx context.Context, tx pgx.Tx, keys ...K) error {
	switch {
	case ctx == nil:
		return errors.New("postgres: Tag: ctx is nil")
	case tx == nil:
		return errors.New("postgres: Tag: tx is nil")
	}
	q, args, err := t.Query(keys...)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return fmt.Errorf("postgres: tag: %w", err)
	}
	return nil
}

// Query returns the statement that Tag runs for keys, with its arguments
// (see [Follower.TagQuery]).
func (t *tagger[K]) Query(keys ...K) (query string, args []any, err error) {
	content, err := t.Content("postgres: Tag", keys...)
	if err != nil {
		return "", nil, err
	}
	if t.notify {
		return `SELECT set_config('cuckooguard.origin', coalesce(current_setting('cuckooguard.origin', true), '') || $1, true)`, []any{string(content)}, nil
	}
	q, args := tagStatement(content)
	return q, args, nil
}

// tagStatement returns the statement that writes a tag of content in the
// writing transaction, through logical decoding, with its arguments.
func tagStatement(content []byte) (string, []any) {
	return `SELECT pg_logical_emit_message(true, 'cuckooguard.origin', $1::bytea)`, []any{content}
}

// Tag names the keys that transaction tx creates on behalf of this
// process's Loader: the Follower skips the inserts of exactly those keys
// in tx, once each, because the Loader added them to its guard before the
// write. Every other row tx inserts (a second row, a row a trigger
// writes) is applied from the stream as usual. Call it inside the write
// function of guarded.Loader.Insert with the Insert's key (or of
// InsertGenerated, with the keys its INSERT returned), at any point of the
// transaction before its commit, and only there: a key tagged around the
// Loader would be missing from this process's guard. An insert left
// untagged costs an extra copy of its key (a false positive), never a
// missing one.
//
// A key must read back as itself: parse (see [NewFollower]) of its text
// ([WithKeyText]) must give the key. Tag returns an error for a key that
// does not, such as an e-mail address in another case than the one the
// table stores, whose skipped insert would leave the stored form absent
// from the guard. With database/sql, run the statement of
// [Follower.TagQuery] in the transaction.
func (f *Follower[K]) Tag(ctx context.Context, tx pgx.Tx, keys ...K) error {
	return f.tags.Tag(ctx, tx, keys...)
}

// TagQuery returns the statement that [Follower.Tag] runs for keys, with
// its arguments, for drivers other than pgx: for example
// tx.ExecContext(ctx, query, args...) with database/sql. Through logical
// decoding it emits a transactional message (pg_logical_emit_message)
// that names this Follower's origin and run and the keys; with
// [WithNotify] it appends them to the setting the trigger reads. It
// returns an error for no keys or a key that does not read back as
// itself.
func (f *Follower[K]) TagQuery(keys ...K) (query string, args []any, err error) {
	return f.tags.Query(keys...)
}

// UseColumn makes the Tagger's keys those of table's keyColumn (or of the
// columns of a key of several, [Columns]), whose type
// it reads through a connection of conf (its DSN's startup parameters are
// those of the connections that read keys): [Tagger.Key] returns their
// canonical form, and [Tagger.Tag] refuses a key in another form. It reads
// the type now, connecting within timeout, and returns an error wrapping
// [ErrKeyType] for a type the guard cannot follow. A database that does
// not answer is no error: Key reads the type at its first call after, and
// returns [ErrKeyUnknown] until it can. A follower calls it from its
// constructor.
func (t *tagger[K]) UseColumn(conf *pgx.ConnConfig, table, keyColumn string, timeout time.Duration) error {
	if conf == nil || table == "" || keyColumn == "" || timeout <= 0 {
		return errors.New("postgres: Tagger.UseColumn needs a connection config, a table, a key column and a timeout")
	}
	if _, err := splitColumns(keyColumn); err != nil {
		return err
	}
	t.col = &column{conf: conf.Copy(), table: table, key: keyColumn, timeout: timeout}
	return t.Tagger.UseColumn(t.col, func(err error) bool { return errors.Is(err, ErrKeyType) })
}

// ReadColumn reads the type of the Tagger's column ([Tagger.UseColumn])
// again, through conn, and returns an error wrapping [ErrKeyType] for a
// type the guard cannot follow. A follower calls it at the start of each
// session, before the session can make its Loader ready: whenever the
// follower follows, Key knows the forms its guard holds (UseColumn may
// not have reached the database). It reuses citext's map while the
// database's ctype and its version stay the same.
func (t *tagger[K]) ReadColumn(ctx context.Context, conn *pgx.Conn) error {
	switch {
	case ctx == nil || conn == nil:
		return errors.New("postgres: Tagger.ReadColumn needs a context and a connection")
	case t.col == nil:
		return errors.New("postgres: Tagger.ReadColumn: the Tagger has no column (Tagger.UseColumn)")
	}
	r, err := resolve(ctx, conn, t.col.table)
	if err != nil {
		return err
	}
	rule, err := readKeyRule(ctx, conn, r, t.col.key, conn.Config().RuntimeParams, t.rule())
	if err != nil {
		return err
	}
	t.setRule(rule)
	return nil
}

// setColumn makes c the tagger's column, without reading it.
func (t *tagger[K]) setColumn(c *column) {
	t.col = c
	t.SetColumn(c)
}

// setRule makes r the key column's forms: a follower's session read them.
func (t *tagger[K]) setRule(r *keyRule) { t.SetForm(r) }

// rule returns the key column's forms, or nil if they are not known yet.
func (t *tagger[K]) rule() *keyRule {
	r, _ := t.Form().(*keyRule)
	return r
}

// column is a key column, and how to read its type.
type column struct {
	conf       *pgx.ConnConfig
	table, key string
	timeout    time.Duration
}

// readRuleTimeout bounds the queries that read a key column's forms
// through a connection of their own (citext's map takes the server a
// quarter of a second), beyond the timeout of connecting.
const readRuleTimeout = 10 * time.Second

// Read reads the column's forms, as follow.KeyColumn.
func (c *column) Read() (follow.KeyForm, error) {
	r, err := c.read()
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Composite reports whether the key is of several columns.
func (c *column) Composite() bool { return strings.Contains(c.key, columnSep) }

// read reads the column's forms through a connection of its own, made
// within the column's timeout.
func (c *column) read() (*keyRule, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout+readRuleTimeout)
	defer cancel()
	conf := c.conf.Copy()
	conf.ConnectTimeout = c.timeout
	return readRuleOf(ctx, conf, c.table, c.key)
}

// readRuleOf reads the forms of table's key column through a connection
// of conf.
func readRuleOf(ctx context.Context, conf *pgx.ConnConfig, table, key string) (*keyRule, error) {
	conn, err := keyTypeConn(ctx, conf)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	r, err := resolve(ctx, conn, table)
	if err != nil {
		return nil, err
	}
	return readKeyRule(ctx, conn, r, key, conn.Config().RuntimeParams, nil)
}

// keyTypeConn connects with conf to read key columns' types.
func keyTypeConn(ctx context.Context, conf *pgx.ConnConfig) (*pgx.Conn, error) {
	conf = conf.Copy()
	conf.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // through a pooler, as dialer.connect
	if conf.RuntimeParams["application_name"] == "" {
		conf.RuntimeParams["application_name"] = "cuckooguard key type"
	}
	conn, err := pgx.ConnectConfig(ctx, conf)
	if err != nil {
		return nil, fmt.Errorf("postgres: read the key column's type: %w", err)
	}
	return conn, nil
}
