package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/cuckooguard/cuckooguard/internal/tagrec"
)

// A tag names, in a writing transaction, the keys it creates through this
// process's Loader, which added them to its guard before the write: the
// Follower skips exactly those inserts when they come back in the binlog,
// instead of adding a second copy. The binlog carries no message of a
// transaction's own (PostgreSQL's pg_logical_emit_message), so a tag is a
// row: inserted into the tag table ([WithTagTable]) and deleted again in
// the same transaction, so that the table stays empty and the binlog
// carries the inserted row, with the transaction's other rows, at its
// commit. Its content is, for each key, "<len>:<run><len>:<key text>",
// where run names this run of this Follower: other processes' tags, and
// this process's from before its guard was replaced by a restored one,
// name other runs, and their inserts are applied.

// Tx is where [Follower.Tag] writes its rows: the transaction that
// creates the keys. A *sql.Tx has the method.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Statement is a SQL statement and its arguments, for a client other than
// database/sql (see [Follower.TagStatements]).
type Statement struct {
	Query string
	Args  []any
}

// Tag names the keys that transaction tx creates on behalf of this
// process's Loader: the Follower skips the inserts of exactly those keys
// in tx, once each, because the Loader added them to its guard before the
// write. Every other row tx inserts (a second row, a row a trigger
// writes) is applied from the binlog as usual. Call it inside the write
// function of guarded.Loader.Insert with the Insert's key (or of
// InsertGenerated, with the keys its INSERT returned), at any point of
// the transaction before its commit, and only there: a key tagged around
// the Loader would be missing from this process's guard. An insert left
// untagged costs an extra copy of its key (a false positive, until the
// next read of the table), never a missing one.
//
// A key must read back as itself: parse (see [NewFollower]) of its text
// ([WithKeyText]) must give the key, and once the Follower has read the
// key column's form, the text must be the column's one text for it (the
// package doc's "Key equality"): Tag returns an error otherwise, writing
// nothing. Tag writes a row to the tag table ([WithTagTable]) and deletes
// it again: the transaction's user needs INSERT and DELETE on it, and the
// table must exist (the Follower creates it at its first session, if its
// user may). It returns an error for no keys.
func (f *Follower[K]) Tag(ctx context.Context, tx Tx, keys ...K) error {
	switch {
	case ctx == nil:
		return errors.New("mysql: Tag: ctx is nil")
	case tx == nil:
		return errors.New("mysql: Tag: tx is nil")
	}
	stmts, err := f.TagStatements(keys...)
	if err != nil {
		return err
	}
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s.Query, s.Args...); err != nil {
			return fmt.Errorf("mysql: tag: %w", err)
		}
	}
	return nil
}

// TagStatements returns the statements that [Follower.Tag] runs for keys,
// in order, with their arguments, for a client other than database/sql:
// run each in the transaction that creates the keys. It returns an error
// for no keys, or a key that does not read back as itself.
func (f *Follower[K]) TagStatements(keys ...K) ([]Statement, error) {
	content, err := f.tags.Content("mysql: Tag", keys...)
	if err != nil {
		return nil, err
	}
	id := rand.Int64() // the row's own: the tags of concurrent transactions do not meet
	return []Statement{
		{Query: "INSERT INTO `" + f.tagTable + "` (id, tag) VALUES (?, ?)", Args: []any{id, content}},
		{Query: "DELETE FROM `" + f.tagTable + "` WHERE id = ?", Args: []any{id}},
	}, nil
}

// own returns the keys that the tags of one transaction name for this
// run, with how many times each, or nil if none does. Tags of other runs,
// and tags it cannot read, name none.
func (f *Follower[K]) own(tags []string) map[K]int {
	if len(tags) == 0 {
		return nil
	}
	return tagrec.Own(f.tags.Run(), tags, f.parse)
}

// Key returns the key that the Loader's guard holds for text, a key of
// the followed column written in any form the server reads as it: parse
// of the column's one text for it (the package doc's "Key equality":
// "alice@example.com" for "Alice@Example.com " under utf8mb4_general_ci,
// "1.5" for the DECIMAL 1.50). Give the Loader's Insert the keys it
// returns, and Tag them: the guard holds each key in that one form. For a
// text the form cannot judge it returns an error (the lookup then goes to
// the store). Before a session has read the column, it reads the column
// through a connection of its own, and returns an error wrapping
// [follow.ErrKeyUnknown] while the server does not answer.
func (f *Follower[K]) Key(text string) (K, error) { return f.tags.Key(text) }

// keyFormNow returns the key column's form as the last session read it,
// or nil.
func (f *Follower[K]) keyFormNow() *keyForm {
	if r, ok := f.tags.Form().(relayForm); ok {
		return r.k
	}
	return nil
}
