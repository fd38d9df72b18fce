package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Rows != 1_000_000 || c.Store != "sqlite" || c.Absent != 0.5 || c.Dist != "uniform" || c.Capacity != 1_000_000 || c.Duration != 10*time.Second || c.Warmup != "before" {
		t.Fatalf("defaults = %+v", c)
	}
	c, err = parseFlags([]string{"-dsn", "postgres://u@127.0.0.1:5432/db", "-rows", "10", "-capacity", "3"}, io.Discard)
	if err != nil || c.Store != "postgres" || c.Capacity != 3 {
		t.Fatalf("postgres DSN: %+v, %v", c, err)
	}
	bad := [][]string{
		{"-rows", "0"}, {"-workers", "0"}, {"-absent", "1.5"}, {"-dist", "pareto"}, {"-dist", "zipf", "-zipf-s", "1"},
		{"-store", "redis"}, {"-store", "postgres"}, {"-duration", "0"}, {"-latency", "-1s"}, {"-capacity", "-1"},
		{"-target", "ftp://x"}, {"-warmup", "later"}, {"-target", "127.0.0.1:8080"}, {"extra"}, {"-nosuchflag"},
	}
	for _, args := range bad {
		var w bytes.Buffer
		if _, err := parseFlags(args, &w); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		} else if w.Len() == 0 {
			t.Errorf("parseFlags(%q) printed nothing", args)
		}
	}
}

func TestPercentilesAndRates(t *testing.T) {
	p := &phase{Hist: newHist(), Ops: 1000, Elapsed: 2 * time.Second}
	for i := int64(1); i <= 1000; i++ {
		p.Hist.RecordValue(i) // 1..1000 µs
	}
	for _, c := range []struct {
		q    float64
		want int64
	}{{0.50, 500}, {0.99, 990}, {0.999, 999}} {
		if got := p.quantile(c.q); got < c.want-1 || got > c.want+1 {
			t.Errorf("quantile(%v) = %d, want %d ± 1", c.q, got, c.want)
		}
	}
	if p.RPS() != 500 {
		t.Errorf("RPS = %v, want 500", p.RPS())
	}
	empty := &phase{}
	if empty.quantile(0.5) != 0 || empty.RPS() != 0 {
		t.Errorf("an empty phase has nonzero stats")
	}
	if got := bucketFor(config{Duration: 10 * time.Second}); got != 200*time.Millisecond {
		t.Errorf("bucketFor(10s) = %v", got)
	}
	if got := bucketFor(config{Duration: time.Second}); got != 100*time.Millisecond {
		t.Errorf("bucketFor(1s) = %v", got)
	}
}

func TestKeyGen(t *testing.T) {
	for _, dist := range []string{"uniform", "zipf"} {
		k := newKeyGen(config{Rows: 100, Absent: 0.25, Dist: dist, ZipfS: 1.2, Seed: 1}, 0)
		absent := 0
		for range 10_000 {
			id, exists := k.next()
			if exists != (id >= 1 && id <= 100) {
				t.Fatalf("%s: id %d exists=%v", dist, id, exists)
			}
			if !exists {
				absent++
			}
		}
		if absent < 2200 || absent > 2800 {
			t.Errorf("%s: %d of 10000 absent, want about 2500", dist, absent)
		}
	}
}

// TestSmokeRun runs the whole command on the in-memory store: a few
// thousand operations per run, and checks the table, the JSON, the chart
// and the arithmetic between them.
//
// With -warmup during, the guarded run may end before the warm-up does (on
// a loaded machine it did): its lookups then all passed through, and the
// test does not ask for avoided queries.
func TestSmokeRun(t *testing.T) {
	for _, warmup := range []string{"before", "during"} {
		t.Run("warmup="+warmup, func(t *testing.T) { smokeRun(t, warmup) })
	}
}

func smokeRun(t *testing.T, warmup string) {
	dir := t.TempDir()
	c, err := parseFlags([]string{"-store", "sim", "-latency", "0", "-rows", "5000", "-capacity", "500",
		"-ops", "4000", "-workers", "4", "-warmup", warmup, "-json", filepath.Join(dir, "r.json"), "-chart", filepath.Join(dir, "c.png"), "-quiet"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), c, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"without guard", "with guard", "requests/s", "db queries", "queries avoided", "guard doublings"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table has no %q", want)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "r.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Runs []struct {
			Name     string  `json:"name"`
			Ops      int64   `json:"ops"`
			Queries  int64   `json:"db_queries"`
			Avoided  int64   `json:"queries_avoided"`
			FalsePos int64   `json:"false_positives"`
			Found    int64   `json:"found"`
			NotFound int64   `json:"not_found"`
			Wrong    int64   `json:"wrong_answers"`
			Errors   int64   `json:"errors"`
			RPS      float64 `json:"requests_per_second"`
			P99      int64   `json:"p99_us"`
			Doubling int     `json:"doublings"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 {
		t.Fatalf("%d runs in the JSON", len(res.Runs))
	}
	plain, guarded := res.Runs[0], res.Runs[1]
	for _, r := range res.Runs {
		if r.Ops != 4000 || r.Found+r.NotFound != r.Ops || r.Wrong != 0 || r.Errors != 0 || r.RPS <= 0 || r.P99 <= 0 {
			t.Errorf("run %+v", r)
		}
	}
	if plain.Queries != plain.Ops {
		t.Errorf("without the guard: %d queries for %d lookups", plain.Queries, plain.Ops)
	}
	// With the guard, every lookup reached the store or was avoided,
	// except that concurrent lookups of one id share a store call.
	if n := guarded.Queries + guarded.Avoided; n > guarded.Ops || n < guarded.Ops*99/100 {
		t.Errorf("with the guard: %d queries, %d avoided, %d lookups", guarded.Queries, guarded.Avoided, guarded.Ops)
	}
	if warmup == "before" && (guarded.Avoided == 0 || guarded.Queries >= plain.Queries) {
		t.Errorf("with the guard filled before the run: %d queries (%d without it), %d avoided", guarded.Queries, plain.Queries, guarded.Avoided)
	}
	if guarded.Doubling == 0 {
		t.Errorf("a guard of capacity 500 filled with 5000 keys did not double")
	}
	if fi, err := os.Stat(filepath.Join(dir, "c.png")); err != nil || fi.Size() == 0 {
		t.Errorf("no chart: %v", err)
	}
}

// TestTargetMode drives a fake users service over loopback HTTP and checks
// that answers and the service's own counters are read correctly.
func TestTargetMode(t *testing.T) {
	var queries, avoided atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /users/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if id > 100 {
			avoided.Add(1)
			http.NotFound(w, r)
			return
		}
		queries.Add(1)
		w.Write([]byte(`{"id":1}`))
	})
	mux.HandleFunc("GET /debug/vars", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"cuckooguard":{"db_lookups":%d,"avoided":%d,"false_positives":0,"items":100,"bits_per_item":19,"doublings":0}}`,
			queries.Load(), avoided.Load())
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c, err := parseFlags([]string{"-target", srv.URL, "-rows", "100", "-ops", "500", "-workers", "3", "-chart", "", "-quiet"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), c, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "service (guarded)") {
		t.Fatalf("table:\n%s", out.String())
	}
	p, err := runTarget(context.Background(), c, func(float64) {})
	if err != nil {
		t.Fatal(err)
	}
	if p.Ops != 500 || p.WrongFound != 0 || p.Errors != 0 || p.Queries != int64(p.Found) || p.Avoided != p.NotFound {
		t.Fatalf("target run: %+v", p)
	}
	srv.CloseClientConnections()
}

// TestChartPathPrinted: the path the run prints is where the chart is, as
// an absolute path; `go -C bench run .` runs in bench/, and printed
// "chart: loadtest.png" for bench/loadtest.png.
func TestChartPathPrinted(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	c, err := parseFlags([]string{"-store", "sim", "-latency", "0", "-rows", "500", "-ops", "500", "-workers", "2", "-chart", "rel.png", "-quiet"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), c, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := "chart: " + filepath.Join(dir, "rel.png") + "\n"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("output does not say %q:\n%s", want, out.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "rel.png")); err != nil {
		t.Fatal(err)
	}
}
