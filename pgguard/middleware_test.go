package pgguard

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cuckooguard/cuckooguard/middleware"
)

// TestTableMiddleware: a table's Middleware rejects an absent key, passes
// a present one in any form the database reads as it (a citext e-mail in
// another case), and counts both in the Service's collector, labelled
// with the table; a second Middleware of the table is an error.
func TestTableMiddleware(t *testing.T) {
	e := newEnv(t, false)
	r := e.start(t, "a", nil)
	waitReady(t, r)
	byEmail, err := r.customers.Middleware(middleware.PathValue("email"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.customers.Middleware(middleware.PathValue("email")); err == nil {
		t.Error("a second Middleware of the table: no error")
	}
	mux := http.NewServeMux()
	handled := 0
	mux.Handle("GET /customers/{email}", byEmail.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handled++ })))
	for _, c := range []struct {
		email   string
		code    int
		handled int
	}{{"SEED1@EXAMPLE.COM", 200, 1}, {"seed2@example.com", 200, 2}, {"nobody@example.com", 404, 2}} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/customers/"+c.email, nil))
		if w.Code != c.code || handled != c.handled {
			t.Errorf("GET /customers/%s: %d, handler ran %d times; want %d, %d", c.email, w.Code, handled, c.code, c.handled)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(r.svc); err != nil {
		t.Fatal(err)
	}
	for result, want := range map[string]float64{"rejected": 1, "passed": 2} {
		got, err := gathered(reg, "cuckooguard_http_requests_total", map[string]string{"table": "customers", "result": result})
		if err != nil || got != want {
			t.Errorf("cuckooguard_http_requests_total{table=customers,result=%s} = %v, %v; want %v", result, got, err, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "cuckooguard_http_requests_total"); err != nil || n != 8 {
		t.Errorf("%d series of cuckooguard_http_requests_total (%v), want 4 results × 2 tables", n, err)
	}
}

// gathered returns the value of the metric name whose labels include
// labels.
func gathered(reg prometheus.Gatherer, name string, labels map[string]string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metric
				}
			}
			return m.GetCounter().GetValue(), nil
		}
	}
	return 0, nil
}
