package metrics_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/internal/metricstest"
	"github.com/cuckooguard/cuckooguard/middleware"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type sample = metricstest.Sample

func gauge(v float64) sample   { return sample{Type: metricstest.Gauge, Value: v} }
func counter(v float64) sample { return sample{Type: metricstest.Counter, Value: v} }

func guardSamples(ns string, st guard.Stats) map[string]sample {
	p := ns + "_guard_"
	return map[string]sample{
		p + "items":                           gauge(float64(st.Items)),
		p + "slots":                           gauge(float64(st.Slots)),
		p + "occupied_slots":                  gauge(float64(st.Copies)),
		p + "void_slots":                      gauge(float64(st.VoidCopies)),
		p + "load_factor":                     gauge(st.LoadFactor),
		p + "estimated_false_positive_ratio":  gauge(st.EstimatedFPR),
		p + "memory_bytes":                    gauge(float64(st.Bytes)),
		p + "memory_limit_bytes":              gauge(float64(st.MaxBytes)),
		p + "memory_reserved_bytes":           gauge(float64(st.ReservedBytes)),
		p + "degraded_shards":                 gauge(float64(st.DegradedShards)),
		p + "shards":                          gauge(float64(st.Shards)),
		p + "saturated_shards":                gauge(float64(st.SaturatedShards)),
		p + "adds_total":                      counter(float64(st.Adds)),
		p + "removes_total":                   counter(float64(st.Removes)),
		p + `add_errors_total{reason="full"}`: counter(float64(st.AddFailures)),
		p + `add_errors_total{reason="too_many_copies"}`: counter(float64(st.DuplicatesRefused)),
		p + "read_retries_total":                         counter(float64(st.ReadRetries)),
		p + "doublings_total":                            counter(float64(st.Doublings)),
		p + "migrations_in_flight":                       gauge(float64(st.MigrationsInFlight)),
		p + "migrations_queued":                          gauge(float64(st.MigrationsQueued)),
		p + "migrations_refused_total":                   counter(float64(st.MigrationsRefused)),
		p + "migration_seconds_total":                    counter(st.TimeMigrating.Seconds()),
	}
}

// newGuard returns a guard that has doubled, refused a key's fifth copy,
// and removed a key, so that most of its counters are not zero.
func newGuard(t *testing.T) *guard.Guard {
	t.Helper()
	g, err := guard.New(guard.WithCapacity(1000), guard.WithMaxBytes(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	for i := range 5000 {
		if err := g.AddString("k" + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		g.AddString("again")
	}
	if err := g.AddString("again"); !errors.Is(err, guard.ErrTooManyCopies) {
		t.Fatalf("fifth copy: %v", err)
	}
	g.RemoveString("k1")
	g.MarkDegraded(1)
	settle(t, g)
	return g
}

// settle waits until g has no doubling queued or running, so that its
// statistics stay put between a scrape and the Stats the test compares
// it with.
func settle(t *testing.T, g *guard.Guard) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for st := g.Stats(); st.MigrationsInFlight > 0 || st.MigrationsQueued > 0; st = g.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("doublings still running after 10 s: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGuardCollector(t *testing.T) {
	g := newGuard(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewGuardCollector(g))
	got := metricstest.Gather(t, reg)
	st := g.Stats()
	if st.Doublings == 0 || st.DuplicatesRefused != 1 || st.Removes != 1 || st.MaxBytes != 64<<20 || st.DegradedShards != 1 || st.ReservedBytes <= st.Bytes {
		t.Fatalf("the guard did not double, refuse, remove, keep stash room and mark a shard degraded: %+v", st)
	}
	metricstest.Compare(t, got, guardSamples("cuckooguard", st))
	metricstest.Lint(t, reg)
}

func TestLoaderCollector(t *testing.T) {
	ctx := context.Background()
	rows := map[int]string{}
	for i := range 1000 {
		rows[2*i] = "row"
	}
	lookup := func(_ context.Context, id int) (string, error) {
		if v, ok := rows[id]; ok {
			return v, nil
		}
		return "", guarded.ErrNotFound
	}
	g, err := guard.New(guard.WithCapacity(1000))
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[int, string](lookup), guarded.WithNegativeCache(1000, time.Hour), guarded.WithUnsettled(1, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Get(ctx, 1) // passed through: not ready yet
	if err := l.Fill(ctx, func(yield func(int, error) bool) {
		for id := range rows {
			if !yield(id, nil) {
				return
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	// Odd ids are absent: about 1 in 8000 is a false positive, so 100,000
	// lookups see some (the chance of none is e^-12). The second round
	// finds those in the negative cache.
	const n = 200_000
	for range 2 {
		for i := range n {
			l.Get(ctx, i)
		}
	}
	// Two inserts whose outcome is unknown: one key kept, one beyond the
	// max of 1.
	for _, id := range []int{1_000_001, 1_000_003} {
		if err := l.Insert(ctx, id, func(context.Context) error { return errors.New("connection reset") }); err == nil {
			t.Fatal("an insert whose write failed succeeded")
		}
	}

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewLoaderCollector(l, metrics.WithNamespace("app"), metrics.WithConstLabels(prometheus.Labels{"table": "users"})))
	got := metricstest.Gather(t, reg)
	st := l.Stats()
	if st.Avoided == 0 || st.LetThrough == 0 || st.PassedThrough != 1 || st.NegativeCacheHits == 0 || st.FalsePositives == 0 || st.Unsettled != 1 || st.UnsettledOverflows != 1 {
		t.Fatalf("want every kind of lookup: %+v", st)
	}
	want := guardSamples("app", st.Guard)
	for k, v := range map[string]sample{
		"app_loader_ready":                                  gauge(1),
		`app_loader_lookups_total{result="avoided"}`:        counter(float64(st.Avoided)),
		`app_loader_lookups_total{result="negative_cache"}`: counter(float64(st.NegativeCacheHits)),
		`app_loader_lookups_total{result="let_through"}`:    counter(float64(st.LetThrough)),
		`app_loader_lookups_total{result="passed_through"}`: counter(1),
		"app_loader_false_positives_total":                  counter(float64(st.FalsePositives)),
		"app_loader_store_calls_total":                      counter(float64(st.StoreCalls)),
		"app_loader_store_batch_calls_total":                counter(0),
		"app_loader_pass_through_shards":                    gauge(0),
		"app_loader_unsettled_keys":                         gauge(1),
		"app_loader_unsettled_overflows_total":              counter(1),
		"app_loader_rebuilding":                             gauge(0),
		`app_loader_rebuilds_total{result="ok"}`:            counter(float64(st.Rebuilds)),
		`app_loader_rebuilds_total{result="error"}`:         counter(float64(st.RebuildErrors)),
		// No lookup carried a token: TestMiddlewareTokenCollector.
		`app_loader_token_lookups_total{result="reached"}`:        counter(0),
		`app_loader_token_lookups_total{result="waited"}`:         counter(0),
		`app_loader_token_lookups_total{result="passed_through"}`: counter(0),
		`app_loader_token_lookups_total{result="foreign"}`:        counter(0),
	} {
		want[k] = v
	}
	// Every sample carries the constant label, sorted after "reason" and
	// "result".
	labelled := make(map[string]sample, len(want))
	for k, v := range want {
		if strings.HasSuffix(k, "}") {
			k = k[:len(k)-1] + `,table="users"}`
		} else {
			k += `{table="users"}`
		}
		labelled[k] = v
	}
	want = labelled
	metricstest.Compare(t, got, want)
	metricstest.Lint(t, reg)
	if total := st.Avoided + st.NegativeCacheHits + st.LetThrough + st.PassedThrough; total != 2*n+1 {
		t.Errorf("lookups by result add up to %d, want the %d Gets made", total, 2*n+1)
	}
}

func TestMiddlewareCollector(t *testing.T) {
	g := newGuard(t)
	mw, err := middleware.New(middleware.GuardFilter(g), middleware.PathValue("id"))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/users/{id}", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "k2" {
			fmt.Fprintln(w, "ok")
			return
		}
		http.NotFound(w, r) // k3 is in the guard but not in the store: a false positive
	})))
	mux.Handle("/users/", mw.Wrap(http.NotFoundHandler())) // no {id}: missing key
	for _, r := range []string{
		"GET /users/k2", "GET /users/k3", // passed
		"GET /users/nope", "GET /users/nope2", "GET /users/nope3", // rejected
		"GET /users/",                                                            // missing key
		"POST /users/k2", "POST /users/k2", "POST /users/k2", "POST /users/nope", // unfiltered
	} {
		method, path, _ := strings.Cut(r, " ")
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, path, nil))
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewMiddlewareCollector(mw))
	got := metricstest.Gather(t, reg)
	st := mw.Stats()
	// Distinct counts, so that a sample that reads the wrong field fails.
	if st.Rejected != 3 || st.Passed != 2 || st.MissingKey != 1 || st.Unfiltered != 4 || st.FalsePositives != 1 {
		t.Fatalf("middleware stats %+v, want 3 rejected, 2 passed, 1 missing key, 4 unfiltered, 1 false positive", st)
	}
	metricstest.Compare(t, got, map[string]sample{
		`cuckooguard_http_requests_total{result="rejected"}`:    counter(3),
		`cuckooguard_http_requests_total{result="passed"}`:      counter(2),
		`cuckooguard_http_requests_total{result="missing_key"}`: counter(1),
		`cuckooguard_http_requests_total{result="unfiltered"}`:  counter(4),
		"cuckooguard_http_false_positives_total":                counter(1),
		`cuckooguard_http_tokens_total{result="read"}`:          counter(0),
		`cuckooguard_http_tokens_total{result="refused"}`:       counter(0),
		`cuckooguard_http_tokens_total{result="set"}`:           counter(0),
	})
	metricstest.Lint(t, reg)
}

// TestCollectorsTogether registers a guard's, a Loader's and a
// middleware's collectors with one registry, told apart by a label; the
// registry refuses collectors whose metrics clash.
func TestCollectorsTogether(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	g1, g2 := newGuard(t), newGuard(t)
	reg.MustRegister(metrics.NewGuardCollector(g1, metrics.WithConstLabels(prometheus.Labels{"guard": "a"})))
	reg.MustRegister(metrics.NewGuardCollector(g2, metrics.WithConstLabels(prometheus.Labels{"guard": "b"})))
	if err := reg.Register(metrics.NewGuardCollector(g2, metrics.WithConstLabels(prometheus.Labels{"guard": "b"}))); err == nil {
		t.Fatal("a second collector with the same metrics and labels was accepted")
	}
	got := metricstest.Gather(t, reg)
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range got {
			if strings.HasPrefix(k, "cuckooguard_guard_items") && !yield(k) {
				return
			}
		}
	})
	if want := []string{`cuckooguard_guard_items{guard="a"}`, `cuckooguard_guard_items{guard="b"}`}; !slices.Equal(names, want) {
		t.Fatalf("items samples %q, want %q", names, want)
	}
	if n := testutil.CollectAndCount(metrics.NewGuardCollector(g1)); n != len(guardSamples("", guard.Stats{})) {
		t.Fatalf("a guard collector gives %d samples, want %d", n, len(guardSamples("", guard.Stats{})))
	}
}

// TestObservedFPRFormula checks the README's alert on the observed
// false-positive rate against a scrape, for a service like
// examples/httpapi: GET /users/{id} behind the middleware, which rejects
// absent keys itself and counts them as http_requests_total{result=
// "rejected"}, and a batch route whose GetMany the guard answers
// (loader_lookups_total{result="avoided"}). A formula that left out either
// path read 1.0 where the true rate was 2e-4 (the fifth defect of the
// client-found issue). With a negative cache, repeats of a false positive
// are answered from it (result="negative_cache") and are false positives
// of the guard all the same.
func TestObservedFPRFormula(t *testing.T) {
	ctx := context.Background()
	// A fixed seed: which absent ids are false positives is then the same
	// every run (enough of them, some asked twice).
	g, err := guard.New(guard.WithCapacity(2000), guard.WithSeed(1))
	if err != nil {
		t.Fatal(err)
	}
	present := map[int64]bool{}
	for id := range int64(2000) {
		present[id] = true
	}
	lookup := func(_ context.Context, id int64) (string, error) {
		if present[id] {
			return "user", nil
		}
		return "", guarded.ErrNotFound
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, string](lookup), guarded.WithNegativeCache(1000, time.Hour))
	if err != nil {
		g.Close()
		t.Fatal(err)
	}
	defer l.Close()
	for id := range int64(2000) {
		if err := l.Insert(ctx, id, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	l.MarkReady()
	mw, err := middleware.New(l, middleware.Int64(middleware.PathValue("id")))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if _, err := l.Get(r.Context(), id); errors.Is(err, guarded.ErrNotFound) {
			http.NotFound(w, r)
		}
	})))
	// The truth: how many absent-key lookups the guard cannot rule out.
	var absent, letThrough int
	ask := func(id int64) {
		if !present[id] {
			absent++
			if g.Contains(int64Key(id)) {
				letThrough++
			}
		}
	}
	for i := range 60_000 {
		id := int64(10_000 + i%30_000) // absent, asked twice
		if i%10 == 0 {
			id = int64(i % 2000) // present
		}
		ask(id)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/users/"+strconv.FormatInt(id, 10), nil))
	}
	batch := make([]int64, 0, 100)
	for i := range 20_000 {
		id := int64(100_000 + i)
		ask(id)
		if batch = append(batch, id); len(batch) == cap(batch) {
			l.GetMany(ctx, batch)
			batch = batch[:0]
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewLoaderCollector(l), metrics.NewMiddlewareCollector(mw))
	s := metricstest.Gather(t, reg)
	v := func(k string) float64 {
		sm, ok := s[k]
		if !ok {
			t.Fatalf("%s: not scraped", k)
		}
		return sm.Value
	}
	// The README's formula, over counters instead of their rates.
	fp := v(`cuckooguard_loader_false_positives_total`) + v(`cuckooguard_loader_lookups_total{result="negative_cache"}`)
	answered := v(`cuckooguard_loader_lookups_total{result="avoided"}`) + v(`cuckooguard_http_requests_total{result="rejected"}`)
	got := fp / (fp + answered)
	want := float64(letThrough) / float64(absent)
	t.Logf("observed FPR from the scrape %.3g, true %.3g (%d of %d absent lookups let through); the Loader-only formula gives %.3g",
		got, want, letThrough, absent, v(`cuckooguard_loader_false_positives_total`)/(v(`cuckooguard_loader_false_positives_total`)+v(`cuckooguard_loader_lookups_total{result="avoided"}`)))
	if letThrough == 0 || v(`cuckooguard_loader_lookups_total{result="negative_cache"}`) == 0 {
		t.Fatalf("no false positive or no negative-cache hit among %d absent lookups: the test checks nothing", absent)
	}
	if got != want {
		t.Fatalf("observed FPR from the scrape = %v, want the true rate %v", got, want)
	}
	if st := l.Stats(); st.ObservedFPR >= 0.5 {
		t.Fatalf("Loader.Stats().ObservedFPR = %v: it must not read as if every absent key got through", st.ObservedFPR)
	}
}

// int64Key is id as the Loader hashes it: 8 bytes, little-endian.
func int64Key(id int64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(id))
	return b[:]
}

// TestNilArguments: the constructors return no error, so a nil statser
// or option panics at once, with a message that says which, rather than
// at the first scrape.
func TestNilArguments(t *testing.T) {
	g := newGuard(t)
	for name, call := range map[string]func(){
		"NewGuardCollector(nil)":          func() { metrics.NewGuardCollector(nil) },
		"NewLoaderCollector(nil *Loader)": func() { metrics.NewLoaderCollector((*guarded.Loader[int, string])(nil)) },
		"NewMiddlewareCollector(nil)":     func() { metrics.NewMiddlewareCollector(nil) },
		"nil option":                      func() { metrics.NewGuardCollector(g, metrics.WithNamespace("x"), nil) },
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.HasPrefix(fmt.Sprint(r), "metrics") {
					t.Errorf("%s panicked with %v, want at once with a metrics: message", name, r)
				}
				t.Logf("%s: %v", name, r)
			}()
			call()
		}()
	}
}

// TestMiddlewareTokenCollector: the token counters of the middleware and
// of its Loader, each a distinct count.
func TestMiddlewareTokenCollector(t *testing.T) {
	g := newGuard(t)
	l, err := guarded.New(g, guarded.GetterFunc[string, string](func(context.Context, string) (string, error) { return "", guarded.ErrNotFound }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Detach()
	tok, _ := guarded.NewToken("db", 5)
	feed.Reached(tok)
	feed.MarkReady()
	mw, err := middleware.New(l, middleware.PathValue("id"))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/users/{id}", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		guarded.Wrote(r.Context(), tok)
		http.NotFound(w, r)
	})))
	for _, r := range []struct{ req, token string }{
		{"GET /users/a", "db.5"}, {"GET /users/b", "db.4"}, {"GET /users/c", "db.3"}, // read, reached
		{"GET /users/d", "other.1"},                      // read, of another stream
		{"GET /users/e", "bad"}, {"GET /users/f", "bad"}, // refused
		{"POST /users/g", ""}, // set
	} {
		method, path, _ := strings.Cut(r.req, " ")
		req := httptest.NewRequest(method, path, nil)
		if r.token != "" {
			req.Header.Set(middleware.TokenHeader, r.token)
		}
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewMiddlewareCollector(mw), metrics.NewLoaderCollector(l))
	got := metricstest.Gather(t, reg)
	want := map[string]sample{
		`cuckooguard_http_tokens_total{result="read"}`:                    counter(4),
		`cuckooguard_http_tokens_total{result="refused"}`:                 counter(2),
		`cuckooguard_http_tokens_total{result="set"}`:                     counter(1),
		`cuckooguard_loader_token_lookups_total{result="reached"}`:        counter(3),
		`cuckooguard_loader_token_lookups_total{result="waited"}`:         counter(0),
		`cuckooguard_loader_token_lookups_total{result="passed_through"}`: counter(0),
		`cuckooguard_loader_token_lookups_total{result="foreign"}`:        counter(3),
	}
	for k := range got {
		if _, ok := want[k]; !ok && !strings.Contains(k, "token") {
			delete(got, k)
		}
	}
	metricstest.Compare(t, got, want)
}
