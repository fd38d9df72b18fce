// Package rpcmetrics exports the statistics of the gRPC and Connect
// interceptors of package rpcguard as Prometheus metrics, with the meaning
// of the HTTP middleware's (package metrics), labelled by the full method
// name. It is apart from package metrics so that services without gRPC do
// not build it.
//
// The metrics, with the default namespace "cuckooguard":
//
//	cuckooguard_rpc_requests_total{method,result}   counter  requests of a guarded method by result: "rejected"
//	                                                         (NotFound without the handler), "passed" (the key may
//	                                                         exist, or the Loader was not ready), "missing_key"; and,
//	                                                         with method="", result="unfiltered": requests of the
//	                                                         methods that are not guarded
//	cuckooguard_rpc_false_positives_total{method}   counter  passed, and the handler answered NotFound
//	cuckooguard_rpc_tokens_total{result}            counter  consistency tokens: "read", "refused" (did not read),
//	                                                         "set" (on the responses of writes)
//
// The method label is the full method name, "/package.Service/Method", of
// the methods the Interceptor guards: a fixed set, whatever clients send.
// Register one collector per Interceptor; to register several in one
// registry, tell them apart with [metrics.WithConstLabels].
package rpcmetrics

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/internal/collect"
	"github.com/cuckooguard/cuckooguard/rpcguard"
)

// InterceptorStatser is what [NewInterceptorCollector] watches: any
// *rpcguard.Interceptor.
type InterceptorStatser interface{ Stats() rpcguard.Stats }

// NewInterceptorCollector returns a collector of the cuckooguard_rpc_*
// metrics of ic, for the methods ic guards (read once, now). It panics if
// ic is nil.
func NewInterceptorCollector(ic InterceptorStatser, opts ...metrics.Option) prometheus.Collector {
	if collect.IsNil(ic) {
		panic("rpcmetrics: NewInterceptorCollector: nothing to watch (nil)")
	}
	s := metrics.Apply(opts)
	c := collect.New(s.Namespace, s.ConstLabels, ic.Stats)
	type S = rpcguard.Stats
	const sub = "rpc"
	requests := collect.Metric{Subsystem: sub, Name: "requests_total", Type: prometheus.CounterValue, Labels: []string{"method", "result"},
		Help: `Requests seen by the interceptor, by full method name and result: "rejected" (NotFound without the handler), "passed" (the key may exist), "missing_key"; and, with method="", "unfiltered" (methods not guarded).`}
	falsePos := collect.Metric{Subsystem: sub, Name: "false_positives_total", Type: prometheus.CounterValue, Labels: []string{"method"},
		Help: "Requests passed to the handler that answered NotFound, by full method name."}
	for _, m := range slices.Sorted(maps.Keys(ic.Stats().Methods)) {
		c.Add(requests, func(s *S) float64 { return float64(s.Methods[m].Rejected) }, m, "rejected").
			Add(requests, func(s *S) float64 { return float64(s.Methods[m].Passed) }, m, "passed").
			Add(requests, func(s *S) float64 { return float64(s.Methods[m].MissingKey) }, m, "missing_key").
			Add(falsePos, func(s *S) float64 { return float64(s.Methods[m].FalsePositives) }, m)
	}
	c.Add(requests, func(s *S) float64 { return float64(s.Unfiltered) }, "", "unfiltered")
	tokens := collect.Metric{Subsystem: sub, Name: "tokens_total", Type: prometheus.CounterValue, Labels: []string{"result"},
		Help: `Consistency tokens: "read" from requests of guarded methods, "refused" (a token that did not read: the request passed through), "set" on the responses of writes.`}
	c.Add(tokens, func(s *S) float64 { return float64(s.Tokens - min(s.Tokens, s.TokensRefused)) }, "read").
		Add(tokens, func(s *S) float64 { return float64(s.TokensRefused) }, "refused").
		Add(tokens, func(s *S) float64 { return float64(s.TokensSet) }, "set")
	return c
}
