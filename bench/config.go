package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"runtime"
	"time"
)

// config is what the flags say.
type config struct {
	Rows     int64         `json:"rows"`
	Workers  int           `json:"workers"`
	Duration time.Duration `json:"duration_ns"`
	Ops      int64         `json:"ops"` // if > 0, each run stops after this many operations instead
	Absent   float64       `json:"absent_fraction"`
	Dist     string        `json:"distribution"` // uniform or zipf
	ZipfS    float64       `json:"zipf_s"`
	Store    string        `json:"store"` // sqlite, postgres or sim
	DSN      string        `json:"-"`
	Latency  time.Duration `json:"sim_latency_ns"`
	Capacity int           `json:"guard_capacity"`
	Target   string        `json:"target,omitempty"`
	Warmup   string        `json:"warmup"` // before or during the guarded run
	JSON     string        `json:"-"`
	Chart    string        `json:"-"`
	Seed     uint64        `json:"seed"`
	Quiet    bool          `json:"-"`
}

// parseFlags parses args into a config, printing errors and usage to w.
func parseFlags(args []string, w io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(w)
	fs.Int64Var(&c.Rows, "rows", 1_000_000, "users in the table, ids 1..rows")
	fs.IntVar(&c.Workers, "workers", 4*runtime.GOMAXPROCS(0), "concurrent clients")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "length of each run")
	fs.Int64Var(&c.Ops, "ops", 0, "operations per run (overrides -duration when > 0)")
	fs.Float64Var(&c.Absent, "absent", 0.5, "fraction of lookups for ids that do not exist")
	fs.StringVar(&c.Dist, "dist", "uniform", "distribution of present ids: uniform or zipf")
	fs.Float64Var(&c.ZipfS, "zipf-s", 1.1, "Zipf exponent s (> 1) for -dist zipf")
	fs.StringVar(&c.Store, "store", "sqlite", "backing store: sqlite, postgres (needs -dsn) or sim (in memory, -latency per query)")
	fs.StringVar(&c.DSN, "dsn", "", "postgres:// URL (implies -store postgres) or SQLite file (default: in the temp dir)")
	fs.DurationVar(&c.Latency, "latency", 2*time.Millisecond, "query latency of -store sim")
	fs.IntVar(&c.Capacity, "capacity", 0, "initial guard capacity (default -rows); smaller makes the guard double while it warms up")
	fs.StringVar(&c.Warmup, "warmup", "before", "fill the guard before the guarded run, or during it (lookups pass through until it is filled, as in a service that has just started)")
	fs.StringVar(&c.Target, "target", "", "base URL of a running examples/httpapi to drive over HTTP instead of in-process calls")
	fs.StringVar(&c.JSON, "json", "", "write the results as JSON to this file (- for stdout)")
	fs.StringVar(&c.Chart, "chart", "loadtest.png", "write a PNG chart of both runs here (empty: none)")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the key sequence")
	fs.BoolVar(&c.Quiet, "quiet", false, "no progress bars")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments %q", fs.Args())
		fmt.Fprintln(w, err)
		return config{}, err
	}
	if err := c.validate(); err != nil {
		fmt.Fprintln(w, "bench:", err)
		fs.Usage()
		return config{}, err
	}
	return c, nil
}

func (c *config) validate() error {
	if c.DSN != "" && c.Store == "sqlite" && isPostgres(c.DSN) {
		c.Store = "postgres"
	}
	switch {
	case c.Rows < 1:
		return errors.New("-rows must be at least 1")
	case c.Workers < 1:
		return errors.New("-workers must be at least 1")
	case c.Ops < 0 || c.Ops == 0 && c.Duration <= 0:
		return errors.New("need -duration > 0 or -ops > 0")
	case c.Absent < 0 || c.Absent > 1:
		return errors.New("-absent must be in [0, 1]")
	case c.Dist != "uniform" && c.Dist != "zipf":
		return fmt.Errorf("-dist %q: want uniform or zipf", c.Dist)
	case c.Dist == "zipf" && c.ZipfS <= 1:
		return errors.New("-zipf-s must be greater than 1")
	case c.Store != "sqlite" && c.Store != "postgres" && c.Store != "sim":
		return fmt.Errorf("-store %q: want sqlite, postgres or sim", c.Store)
	case c.Store == "postgres" && !isPostgres(c.DSN):
		return errors.New("-store postgres needs a postgres:// URL in -dsn")
	case c.Latency < 0:
		return errors.New("-latency must not be negative")
	case c.Capacity < 0:
		return errors.New("-capacity must not be negative")
	case c.Warmup != "before" && c.Warmup != "during":
		return fmt.Errorf("-warmup %q: want before or during", c.Warmup)
	}
	if c.Target != "" {
		u, err := url.Parse(c.Target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("-target %q: want a URL like http://127.0.0.1:8080", c.Target)
		}
	}
	if c.Capacity == 0 {
		c.Capacity = int(c.Rows)
	}
	return nil
}

func isPostgres(dsn string) bool {
	u, err := url.Parse(dsn)
	return err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql")
}
