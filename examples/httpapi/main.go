// Command httpapi is a users service whose GET /users/{id} is guarded by
// cuckooguard: ids the guard has never seen get 404 without a query.
//
//	go run ./httpapi                      # embedded SQLite (a fresh file), 127.0.0.1:8080, 100,000 users
//	go run ./httpapi -rows 1000000 -addr 127.0.0.1:9090
//	go run ./httpapi -dsn postgres://user:pass@127.0.0.1:5432/db
//
// Routes: GET /users/{id} (200 JSON or 404), GET /users?ids=1,2,3 (200
// with {"users": […], "missing": […]}, one query for all the ids the guard
// does not rule out), POST /users with
// {"id": 42, "name": "Ada"} (201, the shape GET answers; the id may also be
// a string of digits; 400 for a field it does not know), or with
// {"name": "Ada"} alone (201 with the id the database generated),
// DELETE /users/{id} (204 or 404),
// GET /metrics (Prometheus), GET /healthz (200 while the process serves),
// GET /readyz (200 when the guard answers on its own, else 503) and
// GET /debug/vars (expvar, with a "cuckooguard" object).
//
// With a PostgreSQL DSN every instance is a replica: it publishes the
// users table's key column for logical decoding (postgres.Publish, safe
// from every instance at once; the server needs wal_level = logical and
// the user the REPLICATION attribute), follows the table's changes with a
// postgres.Follower, and tags its own inserts, so that a row created
// through one instance is found through all of them. Run as many as you
// like against one database. With -snapshot FILE and a stable -origin a
// restarted instance starts from its saved guard instead of reading the
// table; with -notify it follows through a trigger and LISTEN/NOTIFY
// instead, for servers without logical decoding, at a cost to the
// table's writers. With -nats URL and an -origin each the replicas share
// one slot: one of them at a time relays the table's changes to a NATS
// JetStream stream (package fanout), every replica follows the stream,
// and a new replica starts from the guard the relay's replica saved to
// JetStream instead of reading the table.
//
// SIGINT or SIGTERM shut it down gracefully: /readyz turns 503 at once,
// the listener stays open for -drain (so that a load balancer sees the
// 503 and stops sending), then requests in flight finish (up to 10 s) and
// the follower, the guard and the database close.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	dsn := flag.String("dsn", "", "postgres:// URL, or a SQLite file path (default: a fresh file in a temp dir, removed on exit)")
	rows := flag.Int64("rows", 100_000, "users to seed, ids 1..rows")
	origin := flag.String("origin", "", "name of this replica among the replicas, stable across its restarts: its replication slot outlives it, to resume where it stopped (default: none, a temporary slot that dies with the process; with -snapshot, the host name)")
	heartbeat := flag.Duration("heartbeat", 0, "how often the follower checks its stream through the database (default 100ms; lookups pass through once one is 150ms late)")
	notify := flag.Bool("notify", false, "follow the table through a trigger and LISTEN/NOTIFY instead of logical decoding (servers without wal_level=logical; slows the table's writers)")
	snapshot := flag.String("snapshot", "", "file where the follower saves its guard, to restart without reading the table (needs a stable -origin)")
	natsURL := flag.String("nats", "", "follow through a relay and NATS JetStream at this URL (nats://host:4222) instead of a replication slot per replica: one replica at a time relays the table's changes, and all follow the stream (many replicas; needs -origin)")
	service := flag.String("service", "httpapi", "with -nats, the service's name: the same on every replica, another for each database of a cluster; it names the relay (its lease and its one slot for the service's tables)")
	drain := flag.Duration("drain", 0, "on SIGTERM, how long to keep serving with /readyz at 503 before closing the listener")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := config{DSN: *dsn, Rows: *rows, Origin: replicaOrigin(*origin, *snapshot != ""), Heartbeat: *heartbeat, Notify: *notify, Snapshot: *snapshot, NATS: *natsURL, Service: *service}
	if err := run(*addr, cfg, *drain, log); err != nil {
		log.Error("httpapi", "error", err)
		os.Exit(1)
	}
}

// replicaOrigin returns name, or the host name when a stable origin is
// needed (stable: a process that restarts from its snapshot file needs the
// replication slot of its last run), or "" for none. Without an origin
// the follower's slot is temporary and dies with the process: a replica
// started without -origin leaves no slot behind to hold WAL on the
// server. Two running processes with one origin cannot share the slot:
// the second follower says so and retries.
func replicaOrigin(name string, stable bool) string {
	if name == "" && stable {
		if h, err := os.Hostname(); err == nil && h != "" {
			return h
		}
		return "httpapi"
	}
	return name
}

func run(addr string, cfg config, drain time.Duration, log *slog.Logger) error {
	if cfg.Rows < 0 {
		return fmt.Errorf("-rows %d must not be negative", cfg.Rows)
	}
	if drain < 0 || cfg.Heartbeat < 0 {
		return fmt.Errorf("-drain %v and -heartbeat %v must not be negative", drain, cfg.Heartbeat)
	}
	if cfg.DSN == "" {
		// A database of this instance's own: two instances never share
		// (or seed over) one file, and nothing is left behind.
		dir, err := os.MkdirTemp("", "cuckooguard-httpapi-*")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg.DSN = filepath.Join(dir, "users.db")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		a.shutdown(context.Background())
		return err
	}
	// Serve at once; the guard passes lookups through until it is filled.
	// The follower (PostgreSQL) runs until shutdown.
	wctx, stopWarmUp := context.WithCancel(context.Background())
	defer stopWarmUp()
	warmErr := make(chan error, 1)
	go func() { warmErr <- a.warmUp(wctx) }()
	errc := make(chan error, 1)
	go func() { errc <- a.serve(ln) }()
	var runErr error
	select {
	case runErr = <-errc:
	case err := <-warmErr:
		if err == nil {
			// Filled (SQLite): keep serving until a signal.
			select {
			case runErr = <-errc:
			case <-ctx.Done():
			}
		} else {
			// The guard cannot be filled, or the follower cannot follow:
			// stop and say why, rather than pass every lookup through
			// for good.
			runErr = fmt.Errorf("warm-up: %w", err)
		}
	case <-ctx.Done():
	}
	stop()
	if runErr == nil {
		log.Info("shutting down", "drain", drain)
		a.draining.Store(true)
		time.Sleep(drain)
	}
	stopWarmUp()
	<-a.filled // the follower or the warm-up stops before the Loader closes
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = a.shutdown(sctx)
	if runErr != nil {
		return runErr
	}
	if err == nil {
		log.Info("stopped")
	}
	return err
}
