// Command bench is the load test a newcomer runs first: it seeds a users
// table (embedded SQLite by default, 1,000,000 rows), runs the same lookup
// workload twice, without the guard and with it, and prints the two runs
// side by side: requests per second, latency percentiles, database queries
// issued and avoided, the observed false-positive rate, the guard's memory
// and its doublings. It also writes a chart of throughput and p99 latency
// over time (doublings marked) and, with -json, the results as JSON.
//
//	go -C bench run .                                 # defaults: < 60 s on 2 cores
//	go -C bench run . -rows 100000 -duration 5s -absent 0.9 -dist zipf
//	go -C bench run . -store sim -latency 2ms -workers 64
//	go -C bench run . -capacity 100000                # the guard doubles while it warms up
//	go -C bench run . -dsn postgres://user@127.0.0.1:5432/db
//	go -C bench run . -target http://127.0.0.1:8080   # drive examples/httpapi over HTTP
//
// The peer comparison of the filters themselves is a Go benchmark:
// go -C bench test -run='^$' -bench=. ./compare/
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2) // the flag package printed the error and the usage
	}
	if path := os.Getenv("CUCKOOGUARD_CPUPROFILE"); path != "" {
		// For finding where a run spends its time: go tool pprof PATH.
		f, err := os.Create(path)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
