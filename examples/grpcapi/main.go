// Command grpcapi is the users service of examples/httpapi over gRPC, with
// its own client: GetUser is guarded by cuckooguard's interceptor
// (package rpcguard), so that ids the guard has never seen get NotFound
// without a query, and the grpc.health.v1 status follows the guard's
// readiness. The guard's NotFound is the handler's own ("user not
// found"), detail for detail, so that a client cannot tell which one
// answered; serve -guard-detail adds the guard's ErrorInfo instead
// (rpcguard.FromGuard), which the client's get prints.
//
//	grpcapi serve                     # embedded SQLite (a fresh file), 127.0.0.1:50051, 100,000 users
//	grpcapi serve -metrics 127.0.0.1:9464 -rows 1000000
//	grpcapi serve -dsn postgres://user:pass@127.0.0.1:5432/db
//	grpcapi get 42                    # the client: get, create, delete, health
//	grpcapi create -id 43 Ada
//	grpcapi create Grace              # an id the database generates
//	grpcapi delete 43
//	grpcapi health -wait 60s          # waits for SERVING
//	grpcapi loadtest                  # the load test: with and without the guard, side by side
//	grpcapi load -addr HOST:PORT      # load on a running server
//
// The service, cuckooguard.examples.users.v1.UserService (usersv1/users.proto),
// has GetUser, CreateUser and DeleteUser; the server also serves
// grpc.health.v1.Health, SERVING (for "" and for the service) once the
// guard answers on its own and NOT_SERVING before, and, with -metrics,
// Prometheus metrics over HTTP at /metrics.
//
// With a PostgreSQL DSN every instance is a replica that follows the
// users table's changes through logical decoding (postgres.Follower; the
// server needs wal_level = logical and the user the REPLICATION
// attribute), so that a row created through one instance, or by any other
// client of the database, is found through all of them; while an
// instance's follower does not follow, its status is NOT_SERVING.
//
// SIGINT or SIGTERM shut the server down gracefully: the health status
// turns NOT_SERVING at once, the listener stays open for -drain, then
// calls in flight finish (up to 10 s) and the follower, the guard and the
// database close.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cuckooguard/cuckooguard/postgres"
)

// defaultAddr is where the server listens and the client calls by default.
const defaultAddr = "127.0.0.1:50051"

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = serveCmd(args)
	case "get", "create", "delete", "health":
		err = clientCmd(cmd, args, os.Stdout)
	case "load":
		err = loadCmd(args, os.Stdout)
	case "loadtest":
		err = loadTestCmd(args, os.Stdout)
	case "-h", "-help", "--help", "help":
		usage(os.Stdout)
	default:
		usage(os.Stderr)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcapi "+os.Args[1]+":", err)
		os.Exit(1)
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: grpcapi COMMAND [flags] [args]

  serve                 run the server (grpcapi serve -h for its flags)
  get ID                print the user, or NotFound (and, with serve -guard-detail, whether the guard answered it)
  create [-id ID] NAME  create a user (without -id, the database generates the id)
  delete ID             delete a user
  health                print the grpc.health.v1 status (-wait D: until SERVING)
  load                  load a running server: requests/s and latency percentiles
  loadtest              start the server with and without the guard and load both, side by side

The client's commands take -addr (default `+defaultAddr+`).
`)
}

func serveCmd(args []string) error {
	fs := flag.NewFlagSet("grpcapi serve", flag.ContinueOnError)
	addr := fs.String("addr", defaultAddr, "address to listen on")
	metricsAddr := fs.String("metrics", "", "address to serve Prometheus metrics on, at /metrics (default: none)")
	dsn := fs.String("dsn", "", "postgres:// URL, or a SQLite file path (default: a fresh file in a temp dir, removed on exit)")
	rows := fs.Int64("rows", 100_000, "users to seed, ids 1..rows")
	noGuard := fs.Bool("noguard", false, "no guard: every GetUser asks the database (the load test's baseline)")
	guardDetail := fs.Bool("guard-detail", false, "the guard's NotFound carries an ErrorInfo that tells the client the guard answered (default: the handler's own NotFound, detail for detail)")
	heartbeat := fs.Duration("heartbeat", 0, "how often the follower checks its stream through the database (PostgreSQL; default "+postgres.DefaultHeartbeat.String()+")")
	drain := fs.Duration("drain", 0, "on SIGTERM, how long to keep serving with the health status NOT_SERVING before closing the listener")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *rows < 0 || *drain < 0 || *heartbeat < 0 {
		return fmt.Errorf("-rows %d, -drain %v and -heartbeat %v must not be negative", *rows, *drain, *heartbeat)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := config{DSN: *dsn, Rows: *rows, NoGuard: *noGuard, GuardDetail: *guardDetail, Heartbeat: *heartbeat}
	if cfg.DSN == "" {
		// A database of this instance's own, removed on exit.
		dir, err := os.MkdirTemp("", "cuckooguard-grpcapi-*")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg.DSN = filepath.Join(dir, "users.db")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, *addr, *metricsAddr, cfg, *drain, log)
}

// run serves until ctx ends or the warm-up fails, then shuts down.
func run(ctx context.Context, addr, metricsAddr string, cfg config, drain time.Duration, log *slog.Logger) error {
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		a.shutdown(context.Background())
		return err
	}
	var msrv *http.Server
	if metricsAddr != "" {
		mln, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			ln.Close()
			a.shutdown(context.Background())
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", a.metricsHandler())
		msrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go msrv.Serve(mln)
		log.Info("metrics", "addr", "http://"+mln.Addr().String()+"/metrics")
	}
	// Serve at once; the guard passes lookups through, and the health
	// status is NOT_SERVING, until it is filled.
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
		// The guard cannot be filled, or the follower cannot follow:
		// stop and say why, rather than pass every lookup through for
		// good.
		runErr = fmt.Errorf("warm-up: %w", err)
	case <-ctx.Done():
	}
	if runErr == nil {
		log.Info("shutting down", "drain", drain)
		a.draining.Store(true)
		a.health.Shutdown()
		time.Sleep(drain)
	}
	stopWarmUp()
	<-a.filled // the follower or the warm-up stops before the Loader closes
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.shutdown(sctx)
	if msrv != nil {
		msrv.Shutdown(sctx)
	}
	if runErr == nil {
		log.Info("stopped")
	}
	return runErr
}
