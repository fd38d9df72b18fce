package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/internal/tagrec"
)

// A Tagger writes and reads the tags of one follower's run: messages in a
// writing transaction that name the keys it creates through the
// follower's Loader, so that the follower skips exactly those inserts
// when they come back in the change stream. A [Follower] has one; a
// follower of another stream of the same changes (the fanout module's,
// behind a relay) uses one of its own. A Tagger is safe for concurrent
// use.
type Tagger[K comparable] struct {
	origin string
	run    atomic.Pointer[string] // "<origin> <random>": this run's tag
	parse  func(string) (K, error)
	text   func(K) string
	notify bool // tags go to the setting the NOTIFY trigger reads

	rule   atomic.Pointer[keyRule] // the key column's forms (keys.go); nil until read
	col    *column                 // where Key reads them while rule is nil; nil: nowhere
	readMu sync.Mutex              // held while Key reads them
}

// NewTagger returns the Tagger of a run of the follower named origin
// (any name; "" is fine), whose keys read back from their text with parse
// and are written as text by text (nil: the default of [WithKeyText]).
func NewTagger[K comparable](origin string, parse func(string) (K, error), text func(K) string) (*Tagger[K], error) {
	if parse == nil {
		return nil, errors.New("postgres: NewTagger needs a parse function")
	}
	if text == nil {
		text = keyTextOf[K]()
	}
	t := &Tagger[K]{origin: cmp.Or(origin, "-"), parse: parse, text: text}
	t.NewRun()
	return t, nil
}

// NewRun starts another run: tags written from now on are told apart from
// the earlier ones, whose inserts the follower applies rather than skips
// (a restarted process's guard may lack the keys an earlier run added, and
// a guard swapped in lacks those added to the one it replaced).
func (t *Tagger[K]) NewRun() {
	t.run.Store(new(fmt.Sprintf("%s %x", t.origin, rand.Uint64())))
}

// Tag names, in transaction tx, the keys it creates on behalf of the
// follower's Loader (see [Follower.Tag]).
func (t *Tagger[K]) Tag(ctx context.Context, tx pgx.Tx, keys ...K) error {
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
func (t *Tagger[K]) Query(keys ...K) (query string, args []any, err error) {
	if len(keys) == 0 {
		return "", nil, errors.New("postgres: Tag: no keys: name the keys the transaction creates through the Loader")
	}
	content, err := t.content(*t.run.Load(), keys)
	if err != nil {
		return "", nil, err
	}
	if t.notify {
		return `SELECT set_config('cuckooguard.origin', coalesce(current_setting('cuckooguard.origin', true), '') || $1, true)`, []any{string(content)}, nil
	}
	return `SELECT pg_logical_emit_message(true, 'cuckooguard.origin', $1::bytea)`, []any{content}, nil
}

// content returns what a tag of keys by run says: for each key,
// "<len>:<run><len>:<key text>". Records concatenate, so that the tags of
// one transaction can be read as one (WithNotify appends them to one
// setting).
func (t *Tagger[K]) content(run string, keys []K) ([]byte, error) {
	var b []byte
	rule := t.rule.Load()
	for _, k := range keys {
		text := t.text(k)
		if rule != nil {
			if c, err := rule.key(text); err != nil || c != text {
				if err == nil {
					err = fmt.Errorf("its canonical form is %q", c)
				}
				return nil, fmt.Errorf("postgres: Tag: key %v is not in the canonical form of its column's type %s (%v): the Loader would hold a form that no lookup through Key asks for; give the Loader the key that Key returns", k, rule.typ, err)
			}
		}
		if back, err := t.parse(text); err != nil || back != k {
			if err == nil {
				err = fmt.Errorf("it parses as %v", back)
			}
			return nil, fmt.Errorf("postgres: Tag: key %v does not read back from its text %q (%v): the follower could not tell its insert from another key's; give the Loader keys in the form the table stores and parse returns, or set WithKeyText", k, text, err)
		}
		b = tagrec.Append(b, run, text)
	}
	return b, nil
}

// Own returns the keys that the tags of one transaction name for this
// run, with how many times each, or nil if none does. Tags of other
// followers and earlier runs, and tags it cannot read, name none.
func (t *Tagger[K]) Own(tags [][]byte) map[K]int {
	if len(tags) == 0 {
		return nil
	}
	contents := make([]string, len(tags))
	for i, c := range tags {
		contents[i] = string(c)
	}
	return tagrec.Own(*t.run.Load(), contents, t.parse)
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

// keyTextOf returns the default text form of keys of type K: a string as
// it is, an integer in decimal, and anything else as fmt.Sprint prints it
// (a fmt.Stringer's String, such as a UUID's).
func keyTextOf[K comparable]() func(K) string {
	var zero K
	switch any(zero).(type) {
	case string:
		return func(k K) string { return any(k).(string) }
	case int64:
		return func(k K) string { return strconv.FormatInt(any(k).(int64), 10) }
	}
	return func(k K) string { return fmt.Sprint(k) }
}

// Key returns the key that the guard holds for text, a key of the
// followed column written in any form the database reads as it: parse of
// the text's canonical form for the column's type ("ab" for a character(5)
// key stored as "ab   ", "alice@example.com" for the citext
// "Alice@Example.com", "1.5" for the numeric 1.50; the README's "Key
// types" lists them). Look keys up through it, in the Loader and in
// middleware.Parse, and insert the keys it returns: the guard holds each
// key in that one form. For a text of another type's form, or one whose
// value depends on the looking-up session (a timestamp with time zone
// without an offset), Key returns an error: the guard cannot judge it, and
// the lookup must go to the store (the middleware passes a request whose
// key function fails on to the handler).
//
// It returns an error wrapping [ErrKeyUnknown] before the column's type
// is known: see [Tagger.UseColumn].
func (t *Tagger[K]) Key(text string) (K, error) {
	r := t.rule.Load()
	if r == nil {
		var err error
		if r, err = t.readRule(); err != nil {
			return *new(K), err
		}
	}
	s, err := r.key(text)
	if err != nil {
		return *new(K), err
	}
	return t.parse(s)
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
func (t *Tagger[K]) UseColumn(conf *pgx.ConnConfig, table, keyColumn string, timeout time.Duration) error {
	if conf == nil || table == "" || keyColumn == "" || timeout <= 0 {
		return errors.New("postgres: Tagger.UseColumn needs a connection config, a table, a key column and a timeout")
	}
	if _, err := splitColumns(keyColumn); err != nil {
		return err
	}
	t.col = &column{conf: conf.Copy(), table: table, key: keyColumn, timeout: timeout}
	r, err := t.col.read()
	switch {
	case errors.Is(err, ErrKeyType):
		return err
	case err == nil:
		t.rule.Store(r)
	}
	return nil
}

// ReadColumn reads the type of the Tagger's column ([Tagger.UseColumn])
// again, through conn, and returns an error wrapping [ErrKeyType] for a
// type the guard cannot follow. A follower calls it at the start of each
// session, before the session can make its Loader ready: whenever the
// follower follows, Key knows the forms its guard holds (UseColumn may
// not have reached the database). It reuses citext's map while the
// database's ctype and its version stay the same.
func (t *Tagger[K]) ReadColumn(ctx context.Context, conn *pgx.Conn) error {
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
	rule, err := readKeyRule(ctx, conn, r, t.col.key, conn.Config().RuntimeParams, t.rule.Load())
	if err != nil {
		return err
	}
	t.rule.Store(rule)
	return nil
}

// readRule reads the key column's forms for Key, once at a time: a Key
// that finds another one reading returns ErrKeyUnknown rather than wait.
func (t *Tagger[K]) readRule() (*keyRule, error) {
	if t.col == nil {
		return nil, fmt.Errorf("%w: the Tagger has no column (Tagger.UseColumn)", ErrKeyUnknown)
	}
	if !t.readMu.TryLock() {
		return nil, fmt.Errorf("%w: it is being read", ErrKeyUnknown)
	}
	defer t.readMu.Unlock()
	if r := t.rule.Load(); r != nil {
		return r, nil
	}
	r, err := t.col.read()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyUnknown, err)
	}
	t.rule.CompareAndSwap(nil, r)
	return t.rule.Load(), nil
}

// setRule makes r the key column's forms: a follower's session read them.
func (t *Tagger[K]) setRule(r *keyRule) { t.rule.Store(r) }

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

// KeyRule returns the key rule a follower installs in its Loader
// ([guarded.Feed.SetKeyRule]), so that every entry of the Loader, and the
// middleware and rpcguard through it, takes a key in any text the
// database reads as it, as [Tagger.Key] does: the key's text (the
// Tagger's text function), its canonical form for the column's type, and
// parse of that. For a key of several columns ([Columns]) it makes each
// column's text canonical, whatever K is (a [Tuple], or a struct of the
// caller's whose text function writes a Tuple): a key of another number
// of columns, or with a column the rule cannot read, is an error, which
// the Loader answers by passing the lookup to the store. It is nil for
// keys of one column whose type is not a string kind (an integer, a
// [16]byte uuid: one form per value already). Until the
// column's forms are known (a follower reads them at its first session,
// before its Loader is ready) it returns keys as they are. It reads
// nothing from the database.
func (t *Tagger[K]) KeyRule() func(K) (K, error) {
	if reflect.TypeFor[K]().Kind() != reflect.String && (t.col == nil || !strings.Contains(t.col.key, columnSep)) {
		return nil
	}
	return func(k K) (K, error) {
		r := t.rule.Load()
		if r == nil || r.canon == nil {
			return k, nil
		}
		s, err := r.key(t.text(k))
		if err != nil {
			return k, err
		}
		return t.parse(s)
	}
}
