package mysqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/mysql"
)

// Insert creates the row of key: it runs write in a transaction on the
// Service's pool, through the table's Loader (which adds key to the guard
// before the write, so that this replica finds the row at once) and
// tagged as this replica's own (so that its follower does not add the key
// a second time), and commits. It returns the write's consistency token
// ([guarded.Token], [mysql.WriteToken]): a lookup on any replica under it
// ([guarded.WithToken]; the middleware's [middleware.TokenHeader]) finds
// the row. The token is also recorded in ctx's token sink
// ([guarded.Wrote]), so that a handler behind the table's Middleware
// sends it with its response without passing it on.
//
// A string key is tagged in the column's one text (Table.Key: for a
// utf8mb4_general_ci column "ALICE@EXAMPLE.COM" for "Alice@Example.com"),
// the text the Loader adds it in. One whose text the column's form cannot
// judge is written untagged, and the follower adds it a second time: an
// extra copy in this replica's guard, which after the row's delete reads
// present until the next read of the table (a false positive), never a
// missing key.
//
// Through NATS the token is the same: the relay passes each transaction
// on with its GTID sequence number, and the relayed followers report those
// positions in the token's stream ("mariadb-<server_id>-<domain>"), so a
// lookup under the token on any replica waits until that replica's
// follower has applied the write (or the heartbeat after it), as it does
// behind a direct follower.
//
// The token is zero, and the error nil, if the commit succeeded and the
// server gives no token (mysql.ErrNoToken: gtid_strict_mode is OFF, or the
// binlog has GTIDs of several domains; logged once per table) or it could
// not be read (logged): the row exists, and a lookup without a token
// reads it on every replica within the max lag.
//
// [middleware.TokenHeader]: https://pkg.go.dev/github.com/cuckooguard/cuckooguard/middleware#TokenHeader
func (t *Table[K, V]) Insert(ctx context.Context, key K, write func(ctx context.Context, tx *sql.Tx) error) (guarded.Token, error) {
	if err := t.started("Insert"); err != nil {
		return guarded.Token{}, err
	}
	if write == nil {
		return guarded.Token{}, errors.New("mysqlguard: Table.Insert: nil write")
	}
	err := t.loader.Insert(ctx, key, func(ctx context.Context) error {
		return t.inTx(ctx, func(tx *sql.Tx) error {
			if err := t.tag(ctx, tx, key); err != nil {
				return err
			}
			return write(ctx, tx)
		})
	})
	if err != nil {
		return guarded.Token{}, err
	}
	return t.token(ctx), nil
}

// InsertGenerated creates rows whose keys the database generates (an
// AUTO_INCREMENT column, a default): write inserts them in a transaction
// on the Service's pool and gives each key to add before it returns (add
// adds it to the guard and tags it as this replica's own: for
// AUTO_INCREMENT, sql.Result.LastInsertId). As Insert, it returns the
// write's token and records it in ctx's sink.
func (t *Table[K, V]) InsertGenerated(ctx context.Context, write func(ctx context.Context, tx *sql.Tx, add func(K) error) error) (guarded.Token, error) {
	if err := t.started("InsertGenerated"); err != nil {
		return guarded.Token{}, err
	}
	if write == nil {
		return guarded.Token{}, errors.New("mysqlguard: Table.InsertGenerated: nil write")
	}
	err := t.loader.InsertGenerated(ctx, func(ctx context.Context, add func(K) error) error {
		return t.inTx(ctx, func(tx *sql.Tx) error {
			return write(ctx, tx, func(k K) error {
				if err := add(k); err != nil {
					return err
				}
				return t.tag(ctx, tx, k)
			})
		})
	})
	if err != nil {
		return guarded.Token{}, err
	}
	return t.token(ctx), nil
}

// Delete deletes the row of key: write deletes it in a transaction on the
// Service's pool and reports whether a row was there. The guard forgets
// the key when the follower applies the delete from the binlog (see
// guarded.Loader.Delete), once the server has made it visible (the mysql
// package doc). It returns the write's token, as Insert does: a lookup
// under it after the delete may still be let through to the store, which
// answers it.
func (t *Table[K, V]) Delete(ctx context.Context, key K, write func(ctx context.Context, tx *sql.Tx) (existed bool, err error)) (guarded.Token, error) {
	if err := t.started("Delete"); err != nil {
		return guarded.Token{}, err
	}
	if write == nil {
		return guarded.Token{}, errors.New("mysqlguard: Table.Delete: nil write")
	}
	err := t.loader.Delete(ctx, key, func(ctx context.Context) (existed bool, err error) {
		err = t.inTx(ctx, func(tx *sql.Tx) error {
			existed, err = write(ctx, tx)
			return err
		})
		return existed, err
	})
	if err != nil {
		return guarded.Token{}, err
	}
	return t.token(ctx), nil
}

// inTx runs fn in a transaction on the pool and commits it; it rolls back
// if fn fails or panics.
func (t *Table[K, V]) inTx(ctx context.Context, fn func(tx *sql.Tx) error) (err error) {
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("mysqlguard: table %s: begin: %w", t.Name, err)
	}
	committed := false
	defer func() {
		if !committed {
			tx.Rollback()
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	committed = true // a failed commit is rolled back by the server
	return tx.Commit()
}

// tag tags key in tx as this replica's own, in the column's one text. A
// string key whose text the form cannot judge is left untagged: an extra
// copy, never a missing key (see Insert).
func (t *Table[K, V]) tag(ctx context.Context, tx *sql.Tx, key K) error {
	if text, ok := any(key).(string); ok {
		// The Loader added the key in the column's one text (its key
		// rule): the tag names that text.
		if k, err := t.Key(text); err == nil {
			key = k
		}
	}
	var stmts []mysql.Statement
	var err error
	if t.rf != nil {
		var q string
		var args []any
		if q, args, err = t.rf.TagQuery(key); err == nil {
			stmts = []mysql.Statement{{Query: q, Args: args}}
		}
	} else {
		stmts, err = t.f.TagStatements(key)
	}
	if err != nil {
		if _, ok := any(key).(string); ok {
			t.log.LogAttrs(ctx, slog.LevelDebug, "cuckooguard: mysqlguard: a key not in the column's one text is inserted untagged (an extra copy in the guard)",
				slog.String("table", t.Name), slog.Any("error", err))
			return nil
		}
		return fmt.Errorf("mysqlguard: table %s: %w", t.Name, err)
	}
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s.Query, s.Args...); err != nil {
			return fmt.Errorf("mysqlguard: table %s: tag: %w", t.Name, err)
		}
	}
	return nil
}

// token reads the token of the writes committed so far and records it in
// ctx's sink.
func (t *Table[K, V]) token(ctx context.Context) guarded.Token {
	tok, err := mysql.WriteToken(ctx, t.db)
	switch {
	case errors.Is(err, mysql.ErrNoToken):
		if t.noToken.CompareAndSwap(false, true) {
			t.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: mysqlguard: the server gives no consistency tokens: writes return the zero token",
				slog.String("table", t.Name), slog.Any("error", err))
		}
		return guarded.Token{}
	case err != nil:
		t.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: committed, but could not read the write's consistency token",
			slog.String("table", t.Name), slog.Any("error", err))
		return guarded.Token{}
	}
	return guarded.Wrote(ctx, tok)
}

func (t *Table[K, V]) started(what string) error {
	if t.loader == nil {
		return errors.New("mysqlguard: Table." + what + " before Start")
	}
	return nil
}
