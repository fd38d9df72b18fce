package pgguard

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// Insert creates the row of key (in any form the database reads as it:
// the guard holds its column's form, see [Table.Key]): it runs write in a transaction on the
// Service's pool, through the table's Loader (which adds key to the guard
// before the write, so that this replica finds the row at once) and
// tagged as this replica's own (so that its follower does not add the key
// a second time), and commits. It returns the write's consistency token
// ([guarded.Token], [postgres.WriteToken]): a lookup on any replica under
// it ([guarded.WithToken]; the middleware's [middleware.TokenHeader])
// finds the row. The token is also recorded in ctx's token sink
// ([guarded.Wrote]), so that a handler behind the table's Middleware
// sends it with its response without passing it on.
//
// If the commit succeeded and the token could not be read after it, the
// error is nil and the token zero (and logged): the row exists, and a
// lookup without a token reads it on every replica within the max lag.
func (t *Table[K, V]) Insert(ctx context.Context, key K, write func(ctx context.Context, tx pgx.Tx) error) (guarded.Token, error) {
	if err := t.started("Insert"); err != nil {
		return guarded.Token{}, err
	}
	if write == nil {
		return guarded.Token{}, errors.New("pgguard: Table.Insert: nil write")
	}
	key, err := t.canon(key)
	if err != nil {
		return guarded.Token{}, err
	}
	err = t.loader.Insert(ctx, key, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
			if err := t.Tag(ctx, tx, key); err != nil {
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
// identity column, a default): write inserts them in a transaction on
// the Service's pool and gives each key to add before it returns (add
// adds it to the guard and tags it as this replica's own). As Insert, it
// returns the write's token and records it in ctx's sink.
func (t *Table[K, V]) InsertGenerated(ctx context.Context, write func(ctx context.Context, tx pgx.Tx, add func(K) error) error) (guarded.Token, error) {
	if err := t.started("InsertGenerated"); err != nil {
		return guarded.Token{}, err
	}
	if write == nil {
		return guarded.Token{}, errors.New("pgguard: Table.InsertGenerated: nil write")
	}
	err := t.loader.InsertGenerated(ctx, func(ctx context.Context, add func(K) error) error {
		return pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
			return write(ctx, tx, func(k K) error {
				k, err := t.canon(k) // a citext key as RETURNING gives it: in its case
				if err != nil {
					return err
				}
				if err := add(k); err != nil {
					return err
				}
				return t.Tag(ctx, tx, k)
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
// the key when the follower applies the delete (see guarded.Loader.Delete).
// It returns the write's token, as Insert does: a delete is read like a
// creation (a lookup under the token after the delete may still be let
// through to the store, which answers it).
func (t *Table[K, V]) Delete(ctx context.Context, key K, write func(ctx context.Context, tx pgx.Tx) (existed bool, err error)) (guarded.Token, error) {
	if err := t.started("Delete"); err != nil {
		return guarded.Token{}, err
	}
	if write == nil {
		return guarded.Token{}, errors.New("pgguard: Table.Delete: nil write")
	}
	err := t.loader.Delete(ctx, key, func(ctx context.Context) (existed bool, err error) {
		err = pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
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

// token reads the token of the writes committed so far and records it in
// ctx's sink.
func (t *Table[K, V]) token(ctx context.Context) guarded.Token {
	tok, err := postgres.WriteToken(ctx, t.pool)
	if err != nil {
		t.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: committed, but could not read the write's consistency token",
			slog.String("table", t.Name), slog.Any("error", err))
		return guarded.Token{}
	}
	return guarded.Wrote(ctx, tok)
}

// canon returns key in the form the guard holds (Table.Key's), for a
// string key or a postgres.Tuple (each column's text in its form); other
// keys are in theirs already.
func (t *Table[K, V]) canon(key K) (K, error) {
	switch k := any(key).(type) {
	case string:
		return t.f.Key(k)
	case postgres.Tuple:
		return t.f.Key(string(k))
	}
	return key, nil
}

func (t *Table[K, V]) started(what string) error {
	if t.loader == nil {
		return errors.New("pgguard: Table." + what + " before Start")
	}
	return nil
}
