package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cuckooguard/cuckooguard/examples/grpcapi/usersv1"
)

// loadConfig is the workload of a load run.
type loadConfig struct {
	Rows     int64         // ids 1..Rows exist
	Absent   float64       // the share of calls for ids that do not exist
	Workers  int           // concurrent callers
	Duration time.Duration // how long the run lasts
}

// loadResult is what a load run measured.
type loadResult struct {
	Calls   int           // calls answered as expected
	Errors  int           // calls answered otherwise
	Elapsed time.Duration // the run's length
	Known   []time.Duration
	Unknown []time.Duration // latencies of the calls for known and unknown ids, sorted
	Err     error           // the first unexpected answer
}

// rate returns the calls per second.
func (r loadResult) rate() float64 { return float64(r.Calls) / r.Elapsed.Seconds() }

// percentile returns the q-quantile of sorted latencies (0 for none).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// load calls GetUser through cc from cfg.Workers goroutines for
// cfg.Duration: known ids uniformly from 1..cfg.Rows, and a cfg.Absent
// share of ids above it, which must answer NotFound. A call under way when
// the time is up finishes and counts.
func load(ctx context.Context, cc grpc.ClientConnInterface, cfg loadConfig, seed uint64) loadResult {
	users := usersv1.NewUserServiceClient(cc)
	type part struct {
		calls, errors  int
		known, unknown []time.Duration
		err            error
	}
	parts := make([]part, cfg.Workers)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(cfg.Duration)
	for w := range parts {
		wg.Go(func() {
			p := &parts[w]
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for ctx.Err() == nil && time.Now().Before(end) {
				unknown := rng.Float64() < cfg.Absent
				id := 1 + rng.Int64N(max(cfg.Rows, 1))
				if unknown {
					id += cfg.Rows
				}
				t0 := time.Now()
				_, err := users.GetUser(ctx, &usersv1.GetUserRequest{Id: id})
				took := time.Since(t0)
				if want := map[bool]codes.Code{false: codes.OK, true: codes.NotFound}[unknown]; status.Code(err) != want {
					p.errors++
					if p.err == nil {
						p.err = fmt.Errorf("GetUser(%d) = %v, want %v", id, err, want)
					}
					continue
				}
				p.calls++
				if unknown {
					p.unknown = append(p.unknown, took)
				} else {
					p.known = append(p.known, took)
				}
			}
		})
	}
	wg.Wait()
	r := loadResult{Elapsed: time.Since(start)}
	for _, p := range parts {
		r.Calls += p.calls
		r.Errors += p.errors
		r.Known = append(r.Known, p.known...)
		r.Unknown = append(r.Unknown, p.unknown...)
		if r.Err == nil {
			r.Err = p.err
		}
	}
	slices.Sort(r.Known)
	slices.Sort(r.Unknown)
	return r
}

// loadFlags adds the workload's flags to fs.
func loadFlags(fs *flag.FlagSet, cfg *loadConfig) {
	fs.Int64Var(&cfg.Rows, "rows", 100_000, "users 1..rows exist (the server's -rows)")
	fs.Float64Var(&cfg.Absent, "absent", 0.5, "the share of calls for ids that do not exist")
	fs.IntVar(&cfg.Workers, "workers", 8, "concurrent callers")
	fs.DurationVar(&cfg.Duration, "duration", 5*time.Second, "how long each run lasts")
}

func checkLoad(cfg loadConfig) error {
	if cfg.Rows < 1 || cfg.Absent < 0 || cfg.Absent > 1 || cfg.Workers < 1 || cfg.Duration <= 0 {
		return fmt.Errorf("want -rows ≥ 1, -absent in [0, 1], -workers ≥ 1 and -duration > 0")
	}
	return nil
}

// loadCmd loads a running server once and prints what it measured.
func loadCmd(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("grpcapi load", flag.ContinueOnError)
	addr := fs.String("addr", defaultAddr, "the server's address")
	var cfg loadConfig
	loadFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := checkLoad(cfg); err != nil {
		return err
	}
	cc, err := dial(*addr)
	if err != nil {
		return err
	}
	defer cc.Close()
	r := load(context.Background(), cc, cfg, 1)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "calls/s\tknown p50\tknown p99\tunknown p50\tunknown p99\terrors\t\n")
	fmt.Fprintf(tw, "%.0f\t%v\t%v\t%v\t%v\t%d\t\n", r.rate(),
		percentile(r.Known, 0.5), percentile(r.Known, 0.99), percentile(r.Unknown, 0.5), percentile(r.Unknown, 0.99), r.Errors)
	tw.Flush()
	return r.Err
}

// target is one of the load test's two servers.
type target struct {
	name string
	a    *app
	cc   *grpc.ClientConn
	runs []loadResult
	stop func()
}

// loadTestCmd starts the service twice in this process over one SQLite
// file, with the guard and without it (-noguard: every GetUser asks the
// database), and loads them in turns, alternating which goes first, so
// that both see the same machine: the VM's noise, the load generator's
// share of the CPUs. It prints each round and the two side by side.
func loadTestCmd(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("grpcapi loadtest", flag.ContinueOnError)
	dsn := fs.String("dsn", "", "a SQLite file path or postgres:// URL (default: a fresh SQLite file in a temp dir, removed on exit)")
	rounds := fs.Int("rounds", 3, "runs of each server, in turns")
	var cfg loadConfig
	loadFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := checkLoad(cfg); err != nil {
		return err
	}
	if *rounds < 1 {
		return errors.New("-rounds must be at least 1")
	}
	if *dsn == "" {
		dir, err := os.MkdirTemp("", "cuckooguard-grpcapi-load-*")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		*dsn = filepath.Join(dir, "users.db")
	}
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	fmt.Fprintf(w, "seeding %d users\n", cfg.Rows)
	var targets []*target
	defer func() {
		for _, t := range targets {
			t.stop()
		}
	}()
	for _, noGuard := range []bool{true, false} {
		t, err := startTarget(ctx, config{DSN: *dsn, Rows: cfg.Rows, NoGuard: noGuard}, log)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	without, with := targets[0], targets[1]
	for !with.a.loader.Ready() {
		time.Sleep(10 * time.Millisecond)
	}
	dbName := "SQLite"
	if with.a.db.Driver == "pgx" {
		dbName = "PostgreSQL"
	}
	fmt.Fprintf(w, "%s, %d users, %.0f%% unknown ids, %d workers, %d rounds of %v per server, in turns; %d CPUs, %s\n",
		dbName, cfg.Rows, 100*cfg.Absent, cfg.Workers, *rounds, cfg.Duration, runtime.NumCPU(), runtime.Version())
	// A short run of each first, not counted: connections, caches.
	warm := cfg
	warm.Duration = min(cfg.Duration, time.Second)
	for _, t := range targets {
		load(ctx, t.cc, warm, 0)
	}
	queries := map[*target]int64{}
	for r := range *rounds {
		order := []*target{without, with}
		if r%2 == 1 {
			order = []*target{with, without}
		}
		var line []string
		for _, t := range order {
			q := t.a.db.Lookups.Load()
			res := load(ctx, t.cc, cfg, uint64(r+1))
			queries[t] += t.a.db.Lookups.Load() - q
			if res.Err != nil {
				return fmt.Errorf("%s: %w", t.name, res.Err)
			}
			t.runs = append(t.runs, res)
			line = append(line, fmt.Sprintf("%s %.0f calls/s", t.name, res.rate()))
		}
		fmt.Fprintf(w, "round %d: %s\n", r+1, strings.Join(line, ", "))
	}
	rejected := uint64(0)
	for _, m := range with.a.ic.Stats().Methods {
		rejected += m.Rejected
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\twithout guard\twith guard\t\n")
	row := func(name string, f func(*target) string) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", name, f(without), f(with))
	}
	median := func(t *target) float64 {
		r := make([]float64, len(t.runs))
		for i, run := range t.runs {
			r[i] = run.rate()
		}
		slices.Sort(r)
		if n := len(r); n%2 == 0 {
			return (r[n/2-1] + r[n/2]) / 2
		}
		return r[len(r)/2]
	}
	row("calls/s, median of the rounds", func(t *target) string {
		if t == with {
			return fmt.Sprintf("%.0f (%+.0f%%)", median(t), 100*(median(with)/median(without)-1))
		}
		return fmt.Sprintf("%.0f", median(t))
	})
	row("calls/s, lowest – highest", func(t *target) string {
		lo, hi := t.runs[0].rate(), t.runs[0].rate()
		for _, r := range t.runs {
			lo, hi = min(lo, r.rate()), max(hi, r.rate())
		}
		return fmt.Sprintf("%.0f – %.0f", lo, hi)
	})
	// Latencies of every round together.
	lat := func(known bool) func(*target) string {
		return func(t *target) string {
			var all []time.Duration
			for _, r := range t.runs {
				if known {
					all = append(all, r.Known...)
				} else {
					all = append(all, r.Unknown...)
				}
			}
			slices.Sort(all)
			return fmt.Sprintf("%d / %d", percentile(all, 0.5).Microseconds(), percentile(all, 0.99).Microseconds())
		}
	}
	row("known ids, p50 / p99 (µs)", lat(true))
	row("unknown ids, p50 / p99 (µs)", lat(false))
	row("database queries", func(t *target) string { return fmt.Sprint(queries[t]) })
	row("answered by the guard", func(t *target) string {
		if t == with {
			return fmt.Sprint(rejected)
		}
		return "-"
	})
	return tw.Flush()
}

// startTarget starts the service with cfg on a loopback port, with a
// client connection to it.
func startTarget(ctx context.Context, cfg config, log *slog.Logger) (*target, error) {
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		a.shutdown(ctx)
		return nil, err
	}
	cc, err := dial(ln.Addr().String())
	if err != nil {
		ln.Close()
		a.shutdown(ctx)
		return nil, err
	}
	wctx, stopWarmUp := context.WithCancel(ctx)
	go a.warmUp(wctx)
	served := make(chan error, 1)
	go func() { served <- a.serve(ln) }()
	name := "with guard"
	if cfg.NoGuard {
		name = "without guard"
	}
	return &target{name: name, a: a, cc: cc, stop: func() {
		cc.Close()
		stopWarmUp()
		<-a.filled
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.shutdown(sctx)
		<-served
	}}, nil
}
