package pgguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/runset"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// Config is what [Start] needs of a service.
type Config struct {
	// Pool is the service's pool: Start publishes the tables through it,
	// sizes the guards by its row estimates, and the followers (and the
	// relay) connect with its connection string unless DSN says otherwise.
	Pool *pgxpool.Pool
	// Service names the service: the same on every replica, and another
	// for each service (and each database of a cluster). Through NATS it
	// names the relay: its lease, its slot, its subjects and its saved
	// guards.
	Service string
	// NATS is a connection to a NATS server with JetStream: the tables are
	// followed through one relay for the whole fleet (one replication
	// slot). Nil: each replica follows the tables directly, a slot per
	// replica and table.
	NATS *nats.Conn
	// DSN is the postgres:// URL the followers and the relay connect with,
	// if not the pool's: a pool behind a transaction-pooling PgBouncer
	// cannot carry a replication connection.
	DSN string
	// Origin names this replica among the service's replicas: stable
	// across its restarts, never shared by two running at once. Default:
	// the host name (a pod's name).
	Origin string
	// SnapshotEvery is how often the relay's replica saves each table's
	// guard to the object store, for new replicas to start from (through
	// NATS). Default: fanout.DefaultSnapshotEvery.
	SnapshotEvery time.Duration
	// Logger is where the Loaders, the followers and the relay log: a
	// table read, a follower that stops following and why, the relay's
	// takeovers. Default: slog.Default(); slog.New(slog.DiscardHandler)
	// logs nothing.
	Logger *slog.Logger
}

// Service is a service's guarded tables on one replica, as [Start] runs
// them. It is an http.Handler for /readyz and a prometheus.Collector of
// everything ([Service.Describe]). It is safe for concurrent use by
// multiple goroutines.
type Service struct {
	cfg     Config
	dsn     string
	relayed follow.Database // the database as the relay and its followers reach it, with NATS
	log     *slog.Logger
	relay   *fanout.Relay
	members []*member
	set     *runset.Set // runs the members and the relay; readiness and Close

	collectOnce sync.Once
	parts       []prometheus.Collector
}

// Start guards tables for the service cfg describes on this replica: it
// publishes each table (postgres.Publish: every replica may, at once),
// makes its Loader, sized by the table's row estimate unless its Capacity
// says otherwise, and starts its follower (and, through NATS, this
// replica's campaign for the relay) in goroutines that [Service.Close]
// stops. It returns once they run, not once they follow: until a table's
// follower follows, its Loader passes every lookup through, and the
// Service answers 503 on /readyz. ctx bounds only the setup.
func Start(ctx context.Context, cfg Config, tables ...Guarded) (*Service, error) {
	switch {
	case ctx == nil:
		return nil, errors.New("pgguard: Start: ctx is nil")
	case cfg.Pool == nil || cfg.Service == "":
		return nil, errors.New("pgguard: Start needs a pool and a service name")
	case len(tables) == 0:
		return nil, errors.New("pgguard: Start needs at least one table")
	}
	s := &Service{cfg: cfg, dsn: cfg.DSN, log: cfg.Logger}
	if s.dsn == "" {
		s.dsn = cfg.Pool.Config().ConnString()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.cfg.Origin == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("pgguard: Start: no Origin, and no host name: %w", err)
		}
		s.cfg.Origin = host
	}
	var source []follow.Table
	seen := map[string]bool{}
	for _, t := range tables {
		if t == nil {
			return nil, errors.New("pgguard: Start: a nil table")
		}
		spec := t.table()
		if spec.name == "" || spec.key == "" || seen[spec.name] {
			return nil, fmt.Errorf("pgguard: Start: table %q needs a name of its own and a key column (Column or Columns, not both)", spec.name)
		}
		seen[spec.name] = true
		if err := postgres.Publish(ctx, cfg.Pool, spec.name, spec.key); err != nil {
			return nil, err
		}
		source = append(source, follow.Table{Table: spec.name, Key: spec.key})
	}
	if cfg.NATS != nil {
		db, err := postgres.Relayed(s.dsn)
		if err != nil {
			return nil, err
		}
		s.relayed = db
		r, err := fanout.NewRelay(s.relayed, cfg.Service, cfg.NATS, source, fanout.WithLogger(s.log))
		if err != nil {
			return nil, err
		}
		s.relay = r
	}
	s.set = runset.New("pgguard", s.log)
	for _, t := range tables {
		m, err := t.setup(ctx, s)
		if err != nil {
			s.set.Close()
			return nil, err
		}
		s.members = append(s.members, m)
		s.set.Add(m.Member)
	}
	runs := map[string]func(context.Context) error{}
	if s.relay != nil {
		runs["relay"] = s.relay.Run
	}
	s.set.Start(runs)
	return s, nil
}

func (s *Service) fanoutOpts() []fanout.Option {
	opts := []fanout.Option{fanout.WithRelay(s.cfg.Service), fanout.WithOrigin(s.cfg.Origin), fanout.WithLogger(s.log)}
	every := s.cfg.SnapshotEvery
	if every == 0 {
		every = fanout.DefaultSnapshotEvery
	}
	return append(opts, fanout.WithSnapshots(fanout.DefaultBucket, every, s.relay.Leading))
}

func (s *Service) postgresOpts() []postgres.Option {
	return []postgres.Option{postgres.WithOrigin(s.cfg.Origin), postgres.WithLogger(s.log)}
}

// Ready reports whether every table's Loader answers on its own: filled,
// and its follower following. While not, some lookups reach the store.
func (s *Service) Ready() bool { return s.set.Ready() }

// ServeHTTP answers a readiness probe (/readyz): 200 "ready" while
// [Service.Ready], else 503 with a line per table that is not, naming it
// and why ("orders: follower resyncing", "customers: relay silent for 2s").
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.set.ServeHTTP(w, r) }

// Close stops the followers and the relay and waits for them, then closes
// the Loaders. It is idempotent. It leaves the publications, slots and
// streams in place, for the next start: [Teardown] removes them.
func (s *Service) Close() error { return s.set.Close() }

// estimate returns 1.25 times the row estimate of table, at least 1,024.
func estimate(ctx context.Context, pool *pgxpool.Pool, table string) (int, error) {
	name, err := postgres.Resolve(ctx, pool, table)
	if err != nil {
		return 0, err
	}
	var rows float64
	if err := pool.QueryRow(ctx, `SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = to_regclass($1)`, pgx.Identifier(strings.SplitN(name, ".", 2)).Sanitize()).Scan(&rows); err != nil {
		return 0, fmt.Errorf("pgguard: the row estimate of %s: %w", table, err)
	}
	return max(int(rows*1.25), 1024), nil
}

// NotFound reports whether err says that no row has the key: the guard's
// answer (guarded.ErrNotFound) or the store's (pgx.ErrNoRows).
func NotFound(err error) bool {
	return errors.Is(err, guarded.ErrNotFound) || errors.Is(err, pgx.ErrNoRows)
}
