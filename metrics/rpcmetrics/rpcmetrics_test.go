package rpcmetrics_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/internal/metricstest"
	"github.com/cuckooguard/cuckooguard/metrics/rpcmetrics"
	"github.com/cuckooguard/cuckooguard/middleware"
	"github.com/cuckooguard/cuckooguard/rpcguard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// An *rpcguard.Interceptor is what the collector watches.
var _ rpcmetrics.InterceptorStatser = (*rpcguard.Interceptor[int64])(nil)

const (
	check = "/grpc.health.v1.Health/Check"
	watch = "/grpc.health.v1.Health/Watch"
	list  = "/grpc.health.v1.Health/List"
)

// TestCollector counts the requests of a real Interceptor, which guards
// the health service's Check and Watch by the service name (a method of
// a generated package that this module imports anyway), and compares the
// samples with them.
func TestCollector(t *testing.T) {
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.AddString("users.v1.UserService"); err != nil {
		t.Fatal(err)
	}
	ic, err := rpcguard.New(middleware.GuardFilter(g), rpcguard.Keys[string]{
		check: rpcguard.Field[string]("service"),
		watch: rpcguard.Field[string]("service"),
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(rpcmetrics.NewInterceptorCollector(ic, metrics.WithConstLabels(prometheus.Labels{"service": "users"})))

	unary := ic.Unary()
	call := func(method, service string, handlerErr error) {
		t.Helper()
		unary(context.Background(), &healthpb.HealthCheckRequest{Service: service}, &grpc.UnaryServerInfo{FullMethod: method},
			func(context.Context, any) (any, error) { return &healthpb.HealthCheckResponse{}, handlerErr })
	}
	notFound := status.Error(codes.NotFound, "unknown service")
	call(check, "users.v1.UserService", nil)      // passed
	call(check, "users.v1.UserService", notFound) // passed, and a false positive
	call(check, "nope.v1.Nope", nil)              // rejected
	call(check, "nope.v1.Nope", nil)              // rejected
	call(check, "", nil)                          // missing key
	call(list, "", nil)                           // not guarded
	counter := func(v float64) metricstest.Sample { return metricstest.Sample{Type: metricstest.Counter, Value: v} }
	want := map[string]metricstest.Sample{
		`cuckooguard_rpc_requests_total{method="` + check + `",result="rejected",service="users"}`:    counter(2),
		`cuckooguard_rpc_requests_total{method="` + check + `",result="passed",service="users"}`:      counter(2),
		`cuckooguard_rpc_requests_total{method="` + check + `",result="missing_key",service="users"}`: counter(1),
		`cuckooguard_rpc_false_positives_total{method="` + check + `",service="users"}`:               counter(1),
		// Every guarded method from the start, before its first request.
		`cuckooguard_rpc_requests_total{method="` + watch + `",result="rejected",service="users"}`:    counter(0),
		`cuckooguard_rpc_requests_total{method="` + watch + `",result="passed",service="users"}`:      counter(0),
		`cuckooguard_rpc_requests_total{method="` + watch + `",result="missing_key",service="users"}`: counter(0),
		`cuckooguard_rpc_false_positives_total{method="` + watch + `",service="users"}`:               counter(0),
		`cuckooguard_rpc_requests_total{method="",result="unfiltered",service="users"}`:               counter(1),
		`cuckooguard_rpc_tokens_total{result="read",service="users"}`:                                 counter(0),
		`cuckooguard_rpc_tokens_total{result="refused",service="users"}`:                              counter(0),
		`cuckooguard_rpc_tokens_total{result="set",service="users"}`:                                  counter(0),
	}
	metricstest.Compare(t, metricstest.Gather(t, reg), want)
	metricstest.Lint(t, reg)
}

func TestNilPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	var ic *rpcguard.Interceptor[int64]
	rpcmetrics.NewInterceptorCollector(ic)
}
