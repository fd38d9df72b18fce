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
// {"id": "42", "name": "Ada"} (201), DELETE /users/{id} (204 or 404), and
// GET /debug/vars (expvar, with a "cuckooguard" object). SIGINT or SIGTERM
// shut it down gracefully.
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
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*addr, *dsn, *rows, log); err != nil {
		log.Error("httpapi", "error", err)
		os.Exit(1)
	}
}

func run(addr, dsn string, rows int64, log *slog.Logger) error {
	if rows < 0 {
		return fmt.Errorf("-rows %d must not be negative", rows)
	}
	if dsn == "" {
		// A database of this instance's own: two instances never share
		// (or seed over) one file, and nothing is left behind.
		dir, err := os.MkdirTemp("", "cuckooguard-httpapi-*")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dsn = filepath.Join(dir, "users.db")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := newApp(ctx, dsn, rows, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		a.shutdown(context.Background())
		return err
	}
	// Serve at once; the guard passes lookups through until it is filled.
	go func() {
		if err := a.warmUp(ctx); err != nil {
			log.Error("warm-up", "error", err)
		}
	}()
	errc := make(chan error, 1)
	go func() { errc <- a.serve(ln) }()
	select {
	case err := <-errc:
		stop()
		<-a.filled
		a.shutdown(context.Background())
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	stop()     // ends a warm-up still running
	<-a.filled // before the database closes under it
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return a.shutdown(sctx)
}
