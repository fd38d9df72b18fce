package mysqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/runset"
	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/fanoutmetrics"
	"github.com/cuckooguard/cuckooguard/metrics/mysqlmetrics"
	"github.com/cuckooguard/cuckooguard/middleware"
	"github.com/cuckooguard/cuckooguard/mysql"
)

// Table is one guarded table of a service: its name, its key column, and
// how a replica loads a row. Give [Start] a pointer to it; after Start,
// Loader, Key, Tag, Insert, Delete and Middleware serve it. A Table is
// used by one Service.
type Table[K comparable, V any] struct {
	// Name is the table, in the database of the Config's DSN and pool.
	Name string
	// Column is the key column: one column with a PRIMARY KEY or a UNIQUE
	// key of its own, NOT NULL (the mysql package doc's "Key equality"
	// lists the types it can follow).
	Column string
	// Get loads the row of a key from the store, for a key the guard may
	// hold.
	Get func(ctx context.Context, key K) (V, error)
	// Parse reads a key from its text as the follower gets it (the
	// column's one text for it: see mysql.NewFollower). It may be nil for
	// keys of type string, int64, int32, int, uint64 and uint32.
	Parse func(text string) (K, error)
	// NotFound reports whether an error of Get means that no row has the
	// key (counted as a false positive of the guard). Nil:
	// errors.Is(err, sql.ErrNoRows).
	NotFound func(error) bool
	// Capacity is how many keys the table's guard is sized for; it grows
	// past that. 0: 1.25 times the table's row estimate
	// (information_schema.TABLES.TABLE_ROWS), at least 1,024.
	Capacity int
	// Options are more options of the table's Loader.
	Options []guarded.Option

	loader  *guarded.Loader[K, V]
	f       *mysql.Follower[K]  // the table's direct follower, without NATS
	rf      *fanout.Follower[K] // its follower of the relay's stream, through NATS
	parse   func(string) (K, error)
	db      *sql.DB                                  // the Service's, for the writes
	log     *slog.Logger                             // the Service's
	mw      atomic.Pointer[middleware.Middleware[K]] // Middleware's, for the Service's collector
	noToken atomic.Bool                              // ErrNoToken was logged once
}

// Loader returns the table's Loader, once [Start] made it (nil before).
func (t *Table[K, V]) Loader() *guarded.Loader[K, V] { return t.loader }

// Key returns the key that the table's guard holds for text, a key of
// the column in any form the server reads as it (mysql.Follower.Key,
// through NATS fanout.Follower.Key: the column's one text, parsed with
// Parse): "ALICE@EXAMPLE.COM" for "alice@example.com " under
// utf8mb4_general_ci. Use it on what clients send
// (middleware.Parse(from, table.Key)); an error means the guard cannot
// judge the text (the lookup then goes to the store).
func (t *Table[K, V]) Key(text string) (K, error) {
	switch {
	case t.rf != nil:
		return t.rf.Key(text)
	case t.f != nil:
		return t.f.Key(text)
	}
	var zero K
	return zero, errors.New("mysqlguard: Table.Key before Start")
}

// Tag names, in transaction tx, the keys it creates through the table's
// Loader (Loader().Insert, InsertGenerated): the follower skips exactly
// those inserts, which the Loader added before the write
// (mysql.Follower.Tag; through NATS fanout.Follower.Tag, whose tag is one
// compound statement, BEGIN NOT ATOMIC … END). Each key must be in the
// column's one text (mysql.Follower.Tag says why); [Table.Insert] tags for
// you.
func (t *Table[K, V]) Tag(ctx context.Context, tx *sql.Tx, keys ...K) error {
	if t.f == nil && t.rf == nil {
		return errors.New("mysqlguard: Table.Tag before Start")
	}
	if tx == nil {
		return errors.New("mysqlguard: Table.Tag needs a transaction")
	}
	if t.rf != nil {
		return t.rf.Tag(ctx, mysql.ExecIn(tx), keys...)
	}
	return t.f.Tag(ctx, tx, keys...)
}

// Middleware returns the HTTP middleware of the table (package
// middleware): it answers 404 for a request whose key the table's guard
// knows is absent, before the handler runs, and reads a consistency token
// the request carries (middleware.TokenHeader). text takes the key's text
// from the request (middleware.PathValue("id"), middleware.Query, …),
// which [Table.Key] parses; a text it cannot parse passes to the handler.
// Its counters are in the Service's collector (metrics'
// cuckooguard_http_*, labelled with the table). A table has one
// Middleware: wrap every route of the table with it; a second call
// returns an error.
func (t *Table[K, V]) Middleware(text middleware.KeyFunc[string], opts ...middleware.Option) (*middleware.Middleware[K], error) {
	if t.loader == nil {
		return nil, errors.New("mysqlguard: Table.Middleware before Start")
	}
	if text == nil {
		return nil, fmt.Errorf("mysqlguard: table %s: Middleware needs a key function", t.Name)
	}
	mw, err := middleware.New(t.loader, middleware.Parse(text, t.Key), opts...)
	if err != nil {
		return nil, fmt.Errorf("mysqlguard: table %s: %w", t.Name, err)
	}
	if !t.mw.CompareAndSwap(nil, mw) {
		return nil, fmt.Errorf("mysqlguard: table %s has a Middleware already: wrap every route of the table with it", t.Name)
	}
	return mw, nil
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

// Guarded is a table that [Start] can guard: a *[Table].
type Guarded interface {
	table() (name, column string)
	setup(ctx context.Context, s *Service) (*member, error)
}

func (t *Table[K, V]) table() (name, column string) {
	if t == nil {
		return "", ""
	}
	return t.Name, t.Column
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
		return nil, fmt.Errorf("mysqlguard: table %s is already started", t.Name)
	}
	parse, err := runset.ParseFor(t.Parse)
	if err != nil {
		return nil, fmt.Errorf("mysqlguard: table %s: %w", t.Name, err)
	}
	l, err := runset.NewLoader(ctx, "mysqlguard", runset.Table[K, V]{Name: t.Name, Get: t.Get, NotFound: t.NotFound, Capacity: t.Capacity, Options: t.Options},
		func(err error) bool { return errors.Is(err, sql.ErrNoRows) },
		func(ctx context.Context) (int, error) { return estimate(ctx, s.cfg.DB, t.Name) }, s.log)
	if err != nil {
		return nil, err
	}
	label := metrics.WithConstLabels(prometheus.Labels{"table": t.Name})
	m := &member{Member: runset.Member{Name: t.Name, Close: l.Close}, collectors: []prometheus.Collector{
		metrics.NewLoaderCollector(l, label),
		metrics.NewMiddlewareCollector(middlewareStats[K]{&t.mw}, label),
	}}
	if s.cfg.NATS != nil {
		f, err := fanout.NewFollower(l, s.cfg.NATS, s.relayed, t.Name, t.Column, parse, s.fanoutOpts()...)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("mysqlguard: table %s: %w", t.Name, err)
		}
		t.rf, m.Run = f, f.Run
		m.collectors = append(m.collectors, fanoutmetrics.NewFollowerCollector(f, label))
		m.State = func() (bool, string) {
			st := f.Stats()
			return l.Ready() && st.State == mysql.Following, fanoutWhy(st)
		}
	} else {
		fopts := []mysql.Option{
			mysql.WithServerID(s.cfg.ServerID(t.Name)),
			mysql.WithHeartbeatTable(HeartbeatTable(s.cfg.Service, t.Name)),
			mysql.WithLogger(s.log),
		}
		if s.cfg.SnapshotDir != "" {
			fopts = append(fopts, mysql.WithSnapshotFile(filepath.Join(s.cfg.SnapshotDir, snapshotName(s.cfg.Service, t.Name))))
		}
		f, err := mysql.NewFollower(l, s.cfg.DSN, t.Name, t.Column, parse, fopts...)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("mysqlguard: table %s: %w", t.Name, err)
		}
		t.f, m.Run = f, f.Run
		m.collectors = append(m.collectors, mysqlmetrics.NewFollowerCollector(f, label))
		m.State = func() (bool, string) {
			st := f.Stats()
			return l.Ready() && st.State == mysql.Following, why(st)
		}
	}
	t.loader, t.parse, t.db, t.log = l, parse, s.cfg.DB, s.log
	return m, nil
}

// why says why a follower's table is not ready.
func why(st mysql.Stats) string {
	switch {
	case st.State == mysql.Behind:
		return fmt.Sprintf("follower behind (no heartbeat back for %v)", time.Since(st.CurrentAsOf).Round(time.Millisecond))
	case st.LastError != nil && st.State == mysql.PassThrough:
		return fmt.Sprintf("follower %s: %v", st.State, st.LastError)
	}
	return "follower " + st.State.String()
}

// fanoutWhy says why a relayed follower's table is not ready.
func fanoutWhy(st fanout.Stats) string {
	return runset.RelayedWhy(st.NATSConnected, st.State, st.RelaySilence, st.Lag, st.LastError)
}
