package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// results is everything a load test measured, as -json writes it.
type results struct {
	Config  config   `json:"config"`
	GoVer   string   `json:"go_version"`
	CPUs    int      `json:"gomaxprocs"`
	Store   string   `json:"store"`
	WarmUp  float64  `json:"warm_up_seconds,omitempty"`
	Phases  []*phase `json:"runs"`
	Started string   `json:"started"`
}

// run runs the load test described by c, printing the table to out and
// progress to errw.
func run(ctx context.Context, c config, out, errw io.Writer) error {
	showBars := !c.Quiet && isTerminal(errw)
	res := &results{Config: c, GoVer: runtime.Version(), CPUs: runtime.GOMAXPROCS(0), Started: time.Now().UTC().Format(time.RFC3339)}
	if c.Target != "" {
		p, err := runTarget(ctx, c, bar(showBars, errw, 100, "GET "+c.Target))
		if err != nil {
			return err
		}
		res.Store = "http " + c.Target
		res.Phases = []*phase{p}
		return report(c, res, out)
	}

	st, err := openStore(ctx, c, errw, bar(showBars, errw, c.Rows, "seeding users"))
	if err != nil {
		return err
	}
	defer st.Close()
	res.Store = c.Store

	// Run 1: every lookup goes to the store.
	q0 := st.Queries()
	plain := runPhase(ctx, c, "without guard", func(ctx context.Context, id int64) error {
		_, err := st.Lookup(ctx, id)
		return notFound(err)
	}, bar(showBars, errw, 100, "run 1/2: without guard"))
	plain.Queries = st.Queries() - q0
	res.Phases = append(res.Phases, plain)
	if err := ctx.Err(); err != nil {
		return err
	}

	// Run 2: the same workload through a Loader that warms up while the
	// run goes on, as a service that has just started would.
	g, err := guard.New(guard.WithCapacity(c.Capacity))
	if err != nil {
		return err
	}
	fillBar := bar(showBars, errw, 100, "warming up the guard")
	loader, err := guarded.New(g, guarded.Funcs[int64, userdb.User]{Lookup: st.Lookup, ListKeys: st.IDs},
		guarded.WithLogger(slog.New(slog.DiscardHandler)),
		guarded.WithFillProgress(func(n int64) { fillBar(float64(n) / float64(c.Rows)) }))
	if err != nil {
		g.Close()
		return err
	}
	defer loader.Close()
	warmed := make(chan error, 1)
	warm := func(start time.Time) {
		err := loader.Fill(ctx, st.IDs(ctx))
		if err == nil {
			res.WarmUp = time.Since(start).Seconds()
		}
		warmed <- err
	}
	d0 := 0
	if c.Warmup == "before" {
		warm(time.Now())
		if err := <-warmed; err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		warmed <- nil
		d0 = loader.Guard().Stats().Doublings
	}
	q0 = st.Queries()
	start := time.Now()
	var doublings []time.Duration
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	if c.Warmup == "during" {
		go warm(start)
	}
	go func() { // record when the guard doubles
		defer close(sampled)
		last := d0
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
				if d := loader.Guard().Stats().Doublings; d > last {
					for range d - last {
						doublings = append(doublings, time.Since(start))
					}
					last = d
				}
			}
		}
	}()
	avoided0 := int64(loader.Stats().Avoided)
	withGuard := runPhase(ctx, c, "with guard", func(ctx context.Context, id int64) error {
		_, err := loader.Get(ctx, id)
		return notFound(err)
	}, bar(showBars, errw, 100, "run 2/2: with guard"))
	close(stopSampling)
	<-sampled
	if err := <-warmed; err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	ls := loader.Stats()
	withGuard.Guarded = true
	withGuard.Queries = st.Queries() - q0
	withGuard.Avoided = int64(ls.Avoided) - avoided0
	withGuard.FalsePos = int64(ls.FalsePositives)
	withGuard.ObservedFPR = ls.ObservedFPR
	withGuard.GuardBytes = ls.Guard.Bytes
	withGuard.BitsPerItem = ls.Guard.BitsPerItem
	withGuard.GuardItems = ls.Guard.Items
	withGuard.DoublingCount = ls.Guard.Doublings
	withGuard.Doublings = doublings
	res.Phases = append(res.Phases, withGuard)
	return report(c, res, out)
}

// notFound maps a store's "no rows" to guarded.ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return guarded.ErrNotFound
	}
	return err
}

// openStore opens the store c names and says on errw which one it is, and
// whether it seeded it or reused a table an earlier run seeded.
func openStore(ctx context.Context, c config, errw io.Writer, progress func(float64)) (store, error) {
	if c.Store == "sim" {
		progress(1)
		return &simStore{rows: c.Rows, latency: c.Latency}, nil
	}
	dsn, where := c.DSN, "the database"
	if dsn == "" {
		dsn = userdb.DefaultSQLitePath(fmt.Sprintf("bench-%d", c.Rows))
		where = dsn
	}
	start := time.Now()
	st, reused, err := openSQL(ctx, dsn, c.Rows, func(n int64) { progress(float64(n) / float64(c.Rows)) })
	if err != nil {
		return nil, err
	}
	if reused {
		fmt.Fprintf(errw, "store: %s %s: reused the %d users an earlier run seeded (delete the file to seed it again)\n", c.Store, where, c.Rows)
	} else {
		fmt.Fprintf(errw, "store: %s %s: seeded %d users in %v\n", c.Store, where, c.Rows, time.Since(start).Round(time.Millisecond))
	}
	return st, nil
}

// runTarget drives a running examples/httpapi over HTTP: GET /users/{id}.
// The service's own /debug/vars says how many queries reached its
// database.
func runTarget(ctx context.Context, c config, progress func(float64)) (*phase, error) {
	base := strings.TrimRight(c.Target, "/")
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: c.Workers, MaxConnsPerHost: c.Workers},
	}
	defer client.CloseIdleConnections()
	before, err := fetchVars(ctx, client, base)
	if err != nil {
		return nil, fmt.Errorf("-target: %w (is examples/httpapi running there?)", err)
	}
	p := runPhase(ctx, c, "service (guarded)", func(ctx context.Context, id int64) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/users/"+strconv.FormatInt(id, 10), nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return nil
		case http.StatusNotFound:
			return guarded.ErrNotFound
		default:
			return fmt.Errorf("GET /users/%d: %s", id, resp.Status)
		}
	}, progress)
	after, err := fetchVars(ctx, client, base)
	if err != nil {
		return nil, err
	}
	p.Guarded = true
	p.Queries = int64(after["db_lookups"] - before["db_lookups"])
	p.Avoided = int64(after["avoided"] - before["avoided"])
	p.FalsePos = int64(after["false_positives"] - before["false_positives"])
	if n := p.Avoided + p.FalsePos; n > 0 {
		p.ObservedFPR = float64(p.FalsePos) / float64(n)
	}
	p.GuardItems = int(after["items"])
	p.BitsPerItem = after["bits_per_item"]
	p.DoublingCount = int(after["doublings"])
	return p, nil
}

// fetchVars returns the numbers of the cuckooguard object of /debug/vars.
func fetchVars(ctx context.Context, client *http.Client, base string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/vars", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v struct {
		G map[string]any `json:"cuckooguard"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.G == nil {
		return nil, fmt.Errorf("GET /debug/vars: no cuckooguard object (%v)", err)
	}
	out := map[string]float64{}
	for k, x := range v.G {
		if f, ok := x.(float64); ok {
			out[k] = f
		}
	}
	return out, nil
}

// bar returns a progress callback taking the done fraction, drawing a bar
// on w when show is set and doing nothing otherwise.
func bar(show bool, w io.Writer, max int64, desc string) func(float64) {
	if !show {
		return func(float64) {}
	}
	b := progressbar.NewOptions64(max,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionClearOnFinish())
	return func(f float64) {
		b.Set64(int64(f * float64(max)))
		if f >= 1 {
			b.Finish()
		}
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
