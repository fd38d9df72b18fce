package mysqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/runset"
	"github.com/cuckooguard/cuckooguard/mysql"
)

// Config is what [Start] needs of a service.
type Config struct {
	// DB is the service's pool (database/sql with any MySQL driver): the
	// writes of [Table.Insert] and [Table.Delete] run on it, and Start
	// sizes the guards by its row estimates (information_schema.TABLES).
	// Its database is the one DSN names.
	DB *sql.DB
	// DSN is what the followers (and, through NATS, the relay) connect
	// with, in the form of github.com/go-sql-driver/mysql
	// (user:password@tcp(host:port)/dbname), as mysql.NewFollower and
	// mysql.Relayed take it: a *sql.DB does not tell its DSN, so it is
	// required. Its user needs REPLICATION SLAVE and SELECT on the tables,
	// CREATE once for the heartbeat tables and the tag table, and INSERT
	// and UPDATE on the heartbeat tables (the mysql package doc's "Setup";
	// through NATS, its "Behind a relay"); DB's user needs INSERT and
	// DELETE on the tag table.
	DSN string
	// Service names the service: the same on every replica, and another
	// for each service. It names the tables' heartbeat tables
	// ([HeartbeatTable]) and, with Origin, the followers' server ids
	// ([ServerID]); through NATS it names the relay: its lease and place
	// (a row of cuckooguard_relay), its subjects and its saved guards.
	Service string
	// NATS is a connection to a NATS server with JetStream: the tables are
	// followed through one relay for the whole fleet (one binlog reader,
	// on the replica that holds the relay's lease: every replica runs one
	// and they elect one), and each replica's fanout.Follower follows the
	// relay's stream. Nil: each replica follows each table directly, a
	// binlog reader per replica and table. The server needs
	// binlog_row_metadata=FULL for the relay (the mysql package doc's
	// "Behind a relay").
	NATS *nats.Conn
	// Origin names this replica among the service's replicas: stable
	// across its restarts, never shared by two running at once. Default:
	// the host name (a pod's name).
	Origin string
	// SnapshotDir is a directory of this replica's own, kept across its
	// restarts (a volume), where each table's follower saves its guard
	// (mysql.WithSnapshotFile, as <service>.<table>.guard): a restarted
	// replica starts from it without reading the table. Empty: no file,
	// and each start reads the tables. Start creates it if missing.
	// Through NATS it is not used: the guards are saved in the object
	// store (SnapshotEvery), for every replica.
	SnapshotDir string
	// SnapshotEvery is how often the replica that holds the relay's lease
	// saves each table's guard to NATS's object store
	// (fanout.DefaultBucket), for replicas that start later to start from
	// without reading the table (through NATS). Default:
	// fanout.DefaultSnapshotEvery.
	SnapshotEvery time.Duration
	// ServerID gives the server id of this replica's follower of table
	// (see [ServerID]), for a fleet that assigns ids itself; through NATS,
	// ServerID("") is the id of this replica's relay's binlog stream. Nil:
	// ServerID(Service, Origin, table).
	ServerID func(table string) uint32
	// Logger is where the Loaders and the followers log: a table read, a
	// follower that stops following and why. Default: slog.Default();
	// slog.New(slog.DiscardHandler) logs nothing.
	Logger *slog.Logger
}

// Service is a service's guarded tables on one replica, as [Start] runs
// them. It is an http.Handler for /readyz and a prometheus.Collector of
// everything ([Service.Describe]). It is safe for concurrent use by
// multiple goroutines.
type Service struct {
	cfg     Config
	log     *slog.Logger
	relayed follow.Database // the database as the relay and its followers reach it, with NATS
	relay   *fanout.Relay   // with NATS
	members []*member
	set     *runset.Set // runs the members and the relay; readiness and Close

	collectOnce sync.Once
	parts       []prometheus.Collector
}

// Start guards tables for the service cfg describes on this replica: it
// makes each table's Loader, sized by the table's row estimate unless its
// Capacity says otherwise, and starts its follower (mysql.Follower, with a
// server id and a heartbeat table of its own; through NATS a
// fanout.Follower of the relay's stream, and this replica's campaign for
// the relay) in goroutines that [Service.Close] stops. It returns once
// they run, not once they follow:
// until a table's follower follows, its Loader passes every lookup
// through, and the Service answers 503 on /readyz. ctx bounds only the
// setup. The followers check the server and the tables when they run: a
// setup that cannot work (mysql.ErrSetup, mysql.ErrKeyType) keeps the
// table passing through, and /readyz names it with the error.
func Start(ctx context.Context, cfg Config, tables ...Guarded) (*Service, error) {
	switch {
	case ctx == nil:
		return nil, errors.New("mysqlguard: Start: ctx is nil")
	case cfg.DB == nil || cfg.DSN == "" || cfg.Service == "":
		return nil, errors.New("mysqlguard: Start needs a pool (DB), the followers' DSN and a service name")
	case len(tables) == 0:
		return nil, errors.New("mysqlguard: Start needs at least one table")
	}
	s := &Service{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.cfg.Origin == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("mysqlguard: Start: no Origin, and no host name: %w", err)
		}
		s.cfg.Origin = host
	}
	if s.cfg.ServerID == nil {
		s.cfg.ServerID = func(table string) uint32 { return ServerID(cfg.Service, s.cfg.Origin, table) }
	}
	if cfg.SnapshotDir != "" {
		if err := os.MkdirAll(cfg.SnapshotDir, 0o755); err != nil {
			return nil, fmt.Errorf("mysqlguard: Start: the snapshot directory: %w", err)
		}
	}
	seen := map[string]bool{}
	var source []follow.Table
	for _, t := range tables {
		if t == nil {
			return nil, errors.New("mysqlguard: Start: a nil table")
		}
		name, column := t.table()
		if name == "" || column == "" || seen[name] {
			return nil, fmt.Errorf("mysqlguard: Start: table %q needs a name of its own and a key column", name)
		}
		seen[name] = true
		source = append(source, follow.Table{Table: name, Key: column})
	}
	if cfg.NATS != nil {
		db, err := mysql.Relayed(cfg.DSN, mysql.WithServerID(s.cfg.ServerID("")))
		if err != nil {
			return nil, fmt.Errorf("mysqlguard: Start: %w", err)
		}
		s.relayed = db
		r, err := fanout.NewRelay(db, cfg.Service, cfg.NATS, source, fanout.WithLogger(s.log))
		if err != nil {
			return nil, fmt.Errorf("mysqlguard: Start: %w", err)
		}
		s.relay = r
	}
	s.set = runset.New("mysqlguard", s.log)
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

// fanoutOpts are the options of the tables' relayed followers.
func (s *Service) fanoutOpts() []fanout.Option {
	every := s.cfg.SnapshotEvery
	if every == 0 {
		every = fanout.DefaultSnapshotEvery
	}
	return []fanout.Option{fanout.WithRelay(s.cfg.Service), fanout.WithOrigin(s.cfg.Origin), fanout.WithLogger(s.log),
		fanout.WithSnapshots(fanout.DefaultBucket, every, s.relay.Leading)}
}

// Ready reports whether every table's Loader answers on its own: filled,
// and its follower following (a heartbeat back within the max lag). While
// not, some lookups reach the store.
func (s *Service) Ready() bool { return s.set.Ready() }

// ServeHTTP answers a readiness probe (/readyz): 200 "ready" while
// [Service.Ready], else 503 with a line per table that is not, naming it
// and why ("orders: follower resyncing", "users: cannot follow: …",
// through NATS "orders: relay silent for 2s"), and a relay that cannot
// run ("relay: cannot follow: …").
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.set.ServeHTTP(w, r) }

// Close stops the followers (and the relay) and waits for them (each
// direct follower saves its guard to its snapshot file as it stops, with
// SnapshotDir), then closes the Loaders. It is idempotent. It leaves the
// heartbeat tables, and through NATS the relay's place, stream and saved
// guards, in place for the next start: [Teardown] removes them.
func (s *Service) Close() error { return s.set.Close() }

// ServerID returns the server id with which the follower of table on the
// replica origin of service registers its binlog stream, unless
// Config.ServerID says otherwise: 2^31 plus 31 bits of the FNV-1a hash of
// the three names, in [2^31, 2^32). It is the same at every start of the
// replica, so a restarted replica takes its own place (and its heartbeat
// row) back, and no two of a fleet's followers share one unless their
// hashes meet: for n followers on one server, a chance of about
// n²/2^32 (1 in 430,000 for 100). Two readers with one id disconnect each
// other (error 4052) over and over: the metric cuckooguard_mysql_server_id
// shows each follower's, and a fleet that must rule a collision out gives
// Config.ServerID. The range is above the mysql package's random default
// ([2^30, 2^31)) and the small ids servers and their replicas are
// usually given.
func ServerID(service, origin, table string) uint32 {
	h := fnv.New64a()
	for _, s := range []string{service, origin, table} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	sum := h.Sum64()
	return 1<<31 | uint32(sum^sum>>32)&(1<<31-1)
}

// HeartbeatTable returns the name of the table in which the followers of
// table, of every replica of service, write their heartbeat rows (one row
// each, keyed by its server id): cuckooguard_hb_ and 16 hex digits of the
// FNV-1a hash of the two names. A table of the service's and table's own,
// so that [Teardown] can drop it without touching other services' rows.
func HeartbeatTable(service, table string) string {
	h := fnv.New64a()
	h.Write([]byte(service))
	h.Write([]byte{0})
	h.Write([]byte(table))
	return fmt.Sprintf("cuckooguard_hb_%016x", h.Sum64())
}

// snapshotName returns the file name of table's saved guard in the
// snapshot directory: <service>.<table>.guard, with any character but
// letters, digits, '-' and '_' as '_'.
func snapshotName(service, table string) string {
	safe := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
				return r
			}
			return '_'
		}, s)
	}
	return safe(service) + "." + safe(table) + ".guard"
}

// estimate returns 1.25 times the row estimate of table (InnoDB's, in
// information_schema.TABLES), at least 1,024.
func estimate(ctx context.Context, db *sql.DB, table string) (int, error) {
	var rows sql.NullInt64
	err := db.QueryRowContext(ctx, `SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, table).Scan(&rows)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, fmt.Errorf("mysqlguard: no table %s in the pool's database", table)
	case err != nil:
		return 0, fmt.Errorf("mysqlguard: the row estimate of %s: %w", table, err)
	}
	return max(int(float64(max(rows.Int64, 0))*1.25), 1024), nil
}

// NotFound reports whether err says that no row has the key: the guard's
// answer (guarded.ErrNotFound) or the store's (sql.ErrNoRows).
func NotFound(err error) bool {
	return errors.Is(err, guarded.ErrNotFound) || errors.Is(err, sql.ErrNoRows)
}
