package pgguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/runset"
	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/fanoutmetrics"
	"github.com/cuckooguard/cuckooguard/metrics/pgmetrics"
	"github.com/cuckooguard/cuckooguard/middleware"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// Table is one guarded table of a service: its name, its key column, and
// how a replica loads a row. Give [Start] a pointer to it; after Start,
// Loader, Key, Tag and TagQuery serve it. A Table is used by one Service.
type Table[K comparable, V any] struct {
	// Name is the table, as postgres.Publish takes it ("orders",
	// "shop.orders").
	Name string
	// Column is the key column: the table's primary key, or the column of
	// its replica identity.
	Column string
	// Columns are the key's columns, for a table keyed by several, such as
	// a multi-tenant table's (tenant_id, id): all the columns of its
	// primary key or replica identity, in any order, which is the order of
	// each key's postgres.Tuple. Set Column or Columns. Keys are then
	// Tuples (K postgres.Tuple, whose Parse may be nil), or a type of
	// yours that Parse reads from one (postgres.Tuple.Texts); lookups go
	// through the Loader with each column's text in any form the database
	// reads, and [TupleKey] takes them from a request.
	Columns []string
	// Get loads the row of a key from the store, for a key the guard may
	// hold.
	Get func(ctx context.Context, key K) (V, error)
	// Parse reads a key from its text as the followers get it (the
	// column's canonical text, see postgres.Follower.Key). It may be nil
	// for keys of type string, int64, int32 and int.
	Parse func(text string) (K, error)
	// NotFound reports whether an error of Get means that no row has the
	// key (counted as a false positive of the guard). Nil: errors.Is(err,
	// pgx.ErrNoRows).
	NotFound func(error) bool
	// Capacity is how many keys the table's guard is sized for; it grows
	// past that. 0: 1.25 times the table's row estimate (pg_class), at
	// least 1,024.
	Capacity int
	// Options are more options of the table's Loader.
	Options []guarded.Option

	loader *guarded.Loader[K, V]
	pool   *pgxpool.Pool                            // the Service's, for the writes
	log    *slog.Logger                             // the Service's
	f      keyer[K]                                 // the table's follower: a *postgres.Follower or a *fanout.Follower
	mw     atomic.Pointer[middleware.Middleware[K]] // Middleware's, for the Service's collector
}

// Middleware returns the HTTP middleware of the table (package
// middleware): it answers 404 for a request whose key the table's guard
// knows is absent, before the handler runs. text takes the key's text
// from the request (middleware.PathValue("id"), middleware.Query, …),
// which [Table.Key] reads in any form the database reads as the key; a
// text it cannot judge passes to the handler. Its counters are in the
// Service's collector (metrics' cuckooguard_http_*, labelled with the
// table), which the README's false-positive alert reads. A table has one
// Middleware: wrap every route of the table with it; a second call
// returns an error.
func (t *Table[K, V]) Middleware(text middleware.KeyFunc[string], opts ...middleware.Option) (*middleware.Middleware[K], error) {
	if t.loader == nil {
		return nil, errors.New("pgguard: Table.Middleware before Start")
	}
	if text == nil {
		return nil, fmt.Errorf("pgguard: table %s: Middleware needs a key function", t.Name)
	}
	mw, err := middleware.New(t.loader, middleware.Parse(text, t.Key), opts...)
	if err != nil {
		return nil, fmt.Errorf("pgguard: table %s: %w", t.Name, err)
	}
	if !t.mw.CompareAndSwap(nil, mw) {
		return nil, fmt.Errorf("pgguard: table %s has a Middleware already: wrap every route of the table with it", t.Name)
	}
	return mw, nil
}

// TupleKey returns the key function of the middleware of a table keyed
// by several columns ([Table.Columns]): the postgres.Tuple of the texts
// that parts take from the request, one per column in the key's order,
// such as TupleKey(middleware.PathValue("tenant"), middleware.PathValue("id")).
// A request that lacks any of them has no key (the middleware's missing
// key handler answers it). [Table.Middleware] reads each text in any form
// the database reads; one it cannot judge passes to the handler.
func TupleKey(parts ...middleware.KeyFunc[string]) middleware.KeyFunc[string] {
	return func(r *http.Request) (string, bool) {
		texts := make([]string, len(parts))
		for i, p := range parts {
			s, ok := p(r)
			if !ok {
				return "", false
			}
			texts[i] = s
		}
		return string(postgres.TupleOf(texts...)), true
	}
}

// middlewareStats is the Stats of the table's Middleware, zero before
// there is one, for the Service's collector.
type middlewareStats[K comparable] struct {
	mw *atomic.Pointer[middleware.Middleware[K]]
}

func (m middlewareStats[K]) Stats() middleware.Stats {
	if mw := m.mw.Load(); mw != nil {
		return mw.Stats()
	}
	return middleware.Stats{}
}

// keyer is what Table passes on to its follower, direct or relayed.
type keyer[K comparable] interface {
	Key(text string) (K, error)
	TagQuery(keys ...K) (string, []any, error)
}

// Loader returns the table's Loader, once [Start] made it (nil before).
func (t *Table[K, V]) Loader() *guarded.Loader[K, V] { return t.loader }

// Key returns the key of text in the form the guard holds, or an error for
// a text whose key cannot be told (send that lookup to the store). Use it
// on what clients send (middleware.Parse(from, table.Key)).
func (t *Table[K, V]) Key(text string) (K, error) {
	if t.f == nil {
		var zero K
		return zero, errors.New("pgguard: Table.Key before Start")
	}
	return t.f.Key(text)
}

// Tag names, in transaction tx, the keys it creates through the table's
// Loader (Loader().Insert, InsertGenerated): the followers skip exactly
// those inserts, which the Loader added before the write.
func (t *Table[K, V]) Tag(ctx context.Context, tx pgx.Tx, keys ...K) error {
	if t.f == nil {
		return errors.New("pgguard: Table.Tag before Start")
	}
	if ctx == nil || tx == nil {
		return errors.New("pgguard: Table.Tag needs a context and a transaction")
	}
	q, args, err := t.f.TagQuery(keys...)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return fmt.Errorf("pgguard: tag: %w", err)
	}
	return nil
}

// TagQuery returns the statement of Tag for keys, with its arguments, for
// drivers other than pgx.
func (t *Table[K, V]) TagQuery(keys ...K) (string, []any, error) {
	if t.f == nil {
		return "", nil, errors.New("pgguard: Table.TagQuery before Start")
	}
	return t.f.TagQuery(keys...)
}

// Guarded is a table that [Start] can guard: a *[Table].
type Guarded interface {
	table() tableSpec
	setup(ctx context.Context, s *Service) (*member, error)
}

// tableSpec is what Start needs to know of a table before it sets it up.
type tableSpec struct{ name, key string }

// table returns the table's name and key column argument (postgres.Columns
// for several); a key of Column and Columns both has none.
func (t *Table[K, V]) table() tableSpec {
	switch {
	case t == nil:
		return tableSpec{}
	case t.Column != "" && len(t.Columns) > 0:
		return tableSpec{name: t.Name}
	case len(t.Columns) > 0:
		return tableSpec{t.Name, postgres.Columns(t.Columns...)}
	}
	return tableSpec{t.Name, t.Column}
}

// member is a table of a running Service: its Loader's and follower's
// state, their collectors, and how to run and stop it.
type member struct {
	runset.Member
	collectors []prometheus.Collector // the Loader's, the middleware's and the follower's, labelled with the table
}

// setup makes the table's Loader and follower.
func (t *Table[K, V]) setup(ctx context.Context, s *Service) (*member, error) {
	if t.loader != nil {
		return nil, fmt.Errorf("pgguard: table %s is already started", t.Name)
	}
	parse, err := parseFor(t.Parse)
	if err != nil {
		return nil, fmt.Errorf("pgguard: table %s: %w", t.Name, err)
	}
	l, err := runset.NewLoader(ctx, "pgguard", runset.Table[K, V]{Name: t.Name, Get: t.Get, NotFound: t.NotFound, Capacity: t.Capacity, Options: t.Options},
		func(err error) bool { return errors.Is(err, pgx.ErrNoRows) },
		func(ctx context.Context) (int, error) { return estimate(ctx, s.cfg.Pool, t.Name) }, s.log)
	if err != nil {
		return nil, err
	}
	label := metrics.WithConstLabels(prometheus.Labels{"table": t.Name})
	m := &member{Member: runset.Member{Name: t.Name, Close: l.Close}, collectors: []prometheus.Collector{metrics.NewLoaderCollector(l, label),
		metrics.NewMiddlewareCollector(middlewareStats[K]{&t.mw}, label)}}
	if s.cfg.NATS != nil {
		f, err := fanout.NewFollower(l, s.cfg.NATS, s.relayed, t.Name, t.table().key, parse, s.fanoutOpts()...)
		if err != nil {
			l.Close()
			return nil, err
		}
		t.f, m.Run = f, f.Run
		m.collectors = append(m.collectors, fanoutmetrics.NewFollowerCollector(f, label))
		m.State = func() (bool, string) {
			st := f.Stats()
			return l.Ready() && st.State == postgres.Following, fanoutWhy(st)
		}
	} else {
		f, err := postgres.NewFollower(l, s.dsn, t.Name, t.table().key, parse, s.postgresOpts()...)
		if err != nil {
			l.Close()
			return nil, err
		}
		t.f, m.Run = f, f.Run
		m.collectors = append(m.collectors, pgmetrics.NewFollowerCollector(f, label))
		m.State = func() (bool, string) {
			st := f.Stats()
			return l.Ready() && st.State == postgres.Following, directWhy(st)
		}
	}
	t.loader, t.pool, t.log = l, s.cfg.Pool, s.log
	return m, nil
}

// directWhy says why a direct follower's table is not ready.
func directWhy(st postgres.FollowerStats) string {
	switch {
	case st.State == postgres.Behind:
		return fmt.Sprintf("follower behind (lag %v)", st.Lag.Round(time.Millisecond))
	case st.LastError != nil && st.State == postgres.PassThrough:
		return fmt.Sprintf("follower %s: %v", st.State, st.LastError)
	}
	return "follower " + st.State.String()
}

// parseFor returns parse, or the parse of the key types that need none
// (Tuple's among them).
func parseFor[K comparable](parse func(string) (K, error)) (func(string) (K, error), error) {
	return runset.ParseFor(parse, postgres.ParseTuple)
}

// fanoutWhy says why a relayed follower's table is not ready.
func fanoutWhy(st fanout.Stats) string {
	return runset.RelayedWhy(st.NATSConnected, st.State, st.RelaySilence, st.Lag, st.LastError)
}
