// Package metrics exports the statistics of cuckooguard's guards, Loaders
// and HTTP middleware as Prometheus metrics; package pgmetrics does the
// same for the PostgreSQL follower. It is a module of its own, so that the
// core does not depend on the Prometheus client.
//
// Each collector calls the Stats method of what it watches once per
// scrape and keeps no state of its own: register it and forget it.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(metrics.NewLoaderCollector(loader, metrics.WithConstLabels(prometheus.Labels{"table": "users"})))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Register a Loader's collector, not one for the guard it holds: a
// rebuild replaces that guard, and the Loader's collector reports the
// current one under the same cuckooguard_guard_* names. Those counters
// start again from zero when a rebuild swaps in a new guard; Prometheus'
// rate and increase treat that as a counter reset.
//
// The metrics, with the default namespace "cuckooguard":
//
//	cuckooguard_guard_items                         gauge    keys in the guard, counting repeated adds
//	cuckooguard_guard_slots                         gauge    fingerprint slots over all shards
//	cuckooguard_guard_occupied_slots                gauge    occupied slots: items plus copies of short entries
//	cuckooguard_guard_void_slots                    gauge    occupied slots whose entries have no tail bits left
//	cuckooguard_guard_load_factor                   gauge    occupied slots / slots
//	cuckooguard_guard_estimated_false_positive_ratio gauge   expected share of absent keys reported present
//	cuckooguard_guard_memory_bytes                  gauge    memory of the guard and its tables
//	cuckooguard_guard_memory_limit_bytes            gauge    the memory cap (WithMaxBytes); 0 for none
//	cuckooguard_guard_memory_reserved_bytes         gauge    what the memory cap counts: memory with every stash full
//	cuckooguard_guard_shards                        gauge    shards
//	cuckooguard_guard_saturated_shards              gauge    shards that can no longer double
//	cuckooguard_guard_degraded_shards               gauge    shards that refused an add (ErrFull) or were marked so
//	cuckooguard_guard_adds_total                    counter  successful adds
//	cuckooguard_guard_removes_total                 counter  successful removes
//	cuckooguard_guard_add_errors_total{reason}      counter  refused adds: reason="full" or "too_many_copies"
//	cuckooguard_guard_read_retries_total            counter  lookups retried because a writer moved an entry
//	cuckooguard_guard_doublings_total               counter  shard doublings
//	cuckooguard_guard_migrations_in_flight          gauge    background doublings running
//	cuckooguard_guard_migrations_queued             gauge    shards waiting for a background worker
//	cuckooguard_guard_migrations_refused_total      counter  doublings refused by the memory cap
//	cuckooguard_guard_migration_seconds_total       counter  time spent doubling
//
//	cuckooguard_loader_ready                        gauge    1 when the guard answers "not found" on its own
//	cuckooguard_loader_lookups_total{result}        counter  lookups by result: "avoided" (the guard said absent),
//	                                                         "negative_cache", "let_through" (the key may exist;
//	                                                         the store was asked), "passed_through" (not ready)
//	cuckooguard_loader_false_positives_total        counter  let through, and the store said not found
//	cuckooguard_loader_store_calls_total            counter  calls of the store's lookup, batch calls included
//	cuckooguard_loader_store_batch_calls_total      counter  calls of the store's batch lookup
//	cuckooguard_loader_pass_through_shards          gauge    shards passing lookups through until a rebuild
//	cuckooguard_loader_unsettled_keys               gauge    keys of inserts whose outcome is unknown, kept (WithUnsettled)
//	cuckooguard_loader_unsettled_overflows_total    counter  unknown outcomes beyond WithUnsettled's max
//	cuckooguard_loader_rebuilding                   gauge    1 while a rebuild runs
//	cuckooguard_loader_rebuilds_total{result}       counter  rebuilds: result="ok" (swapped in) or "error"
//
//	cuckooguard_http_requests_total{result}         counter  requests seen by the middleware: "rejected" (404
//	                                                         without the handler), "passed", "missing_key",
//	                                                         "unfiltered" (method not filtered)
//	cuckooguard_http_false_positives_total          counter  passed, and the handler answered 404
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/options"
	"github.com/cuckooguard/cuckooguard/metrics/internal/collect"
	"github.com/cuckooguard/cuckooguard/middleware"
)

// DefaultNamespace prefixes every metric name unless [WithNamespace]
// sets another.
const DefaultNamespace = "cuckooguard"

// Settings are what the options of a collector set.
type Settings struct {
	Namespace   string            // the first part of every metric name: DefaultNamespace unless WithNamespace sets another
	ConstLabels prometheus.Labels // labels of fixed value on every metric: none unless WithConstLabels sets some
}

// Option configures a collector.
type Option func(*Settings)

// WithNamespace replaces the namespace, the first part of every metric
// name ("cuckooguard" by default). An empty namespace leaves the names
// starting with the subsystem ("guard_items").
func WithNamespace(ns string) Option {
	return func(s *Settings) { s.Namespace = ns }
}

// WithConstLabels adds labels with fixed values to every metric of the
// collector, to tell apart several guards registered with one registry
// (for example {"table": "users"}).
func WithConstLabels(l prometheus.Labels) Option {
	return func(s *Settings) { s.ConstLabels = l }
}

// Apply returns the Settings that opts make of the defaults, for the
// collectors of other packages (pgmetrics). The constructors of
// collectors return no error, so Apply panics at once for a nil option,
// as they do for a nil argument, rather than at the first scrape.
func Apply(opts []Option) Settings {
	s := Settings{Namespace: DefaultNamespace}
	if err := options.Apply("metrics", &s, opts); err != nil {
		panic(err.Error())
	}
	return s
}

// newCollector returns an empty collector of stats, made by constructor
// with opts. It panics at once if what it watches is nil (see Apply).
func newCollector[S any](constructor string, watched any, stats func() S, opts []Option) *collect.Collector[S] {
	if collect.IsNil(watched) {
		panic("metrics: " + constructor + ": nothing to watch (nil)")
	}
	s := Apply(opts)
	return collect.New(s.Namespace, s.ConstLabels, stats)
}

// GuardStatser is what [NewGuardCollector] watches: a *guard.Guard.
type GuardStatser interface{ Stats() guard.Stats }

// LoaderStatser is what [NewLoaderCollector] watches: any *guarded.Loader.
type LoaderStatser interface{ Stats() guarded.Stats }

// MiddlewareStatser is what [NewMiddlewareCollector] watches: any
// *middleware.Middleware.
type MiddlewareStatser interface{ Stats() middleware.Stats }

// NewGuardCollector returns a collector of the cuckooguard_guard_*
// metrics of g. Each scrape calls g.Stats, which costs O(shards).
func NewGuardCollector(g GuardStatser, opts ...Option) prometheus.Collector {
	c := newCollector("NewGuardCollector", g, func() guard.Stats { return g.Stats() }, opts)
	addGuard(c, func(s *guard.Stats) *guard.Stats { return s })
	return c
}

// NewLoaderCollector returns a collector of the cuckooguard_loader_*
// metrics of l, and the cuckooguard_guard_* metrics of its current guard.
func NewLoaderCollector(l LoaderStatser, opts ...Option) prometheus.Collector {
	c := newCollector("NewLoaderCollector", l, func() guarded.Stats { return l.Stats() }, opts)
	const sub = "loader"
	lookups := collect.Metric{Subsystem: sub, Name: "lookups_total", Type: prometheus.CounterValue, Labels: []string{"result"},
		Help: `Lookups (Get, each key of GetMany) by result: "avoided" (the guard said absent), "negative_cache", "let_through" (the key may exist: the store was asked), "passed_through" (the Loader was not ready).`}
	rebuilds := collect.Metric{Subsystem: sub, Name: "rebuilds_total", Type: prometheus.CounterValue, Labels: []string{"result"},
		Help: `Guard rebuilds by result: "ok" (swapped in) or "error".`}
	tokens := collect.Metric{Subsystem: sub, Name: "token_lookups_total", Type: prometheus.CounterValue, Labels: []string{"result"},
		Help: `Lookups under a consistency token by result: "reached" (the stream had reached it, or the Loader was not ready), "waited" (for the stream, which reached it), "passed_through" (not reached within the token wait: the store was asked), "foreign" (a token of another stream, or one that did not read).`}
	c.Add(collect.Metric{Subsystem: sub, Name: "ready", Type: prometheus.GaugeValue,
		Help: "1 when the guard answers not found on its own; 0 while lookups pass through (warming up, resyncing, follower behind)."},
		func(s *guarded.Stats) float64 { return collect.Bool(s.Ready) }).
		Add(lookups, func(s *guarded.Stats) float64 { return float64(s.Avoided) }, "avoided").
		Add(lookups, func(s *guarded.Stats) float64 { return float64(s.NegativeCacheHits) }, "negative_cache").
		Add(lookups, func(s *guarded.Stats) float64 { return float64(s.LetThrough) }, "let_through").
		Add(lookups, func(s *guarded.Stats) float64 { return float64(s.PassedThrough) }, "passed_through").
		Add(collect.Metric{Subsystem: sub, Name: "false_positives_total", Type: prometheus.CounterValue,
			Help: "Lookups the guard let through for which the store said not found."},
			func(s *guarded.Stats) float64 { return float64(s.FalsePositives) }).
		Add(collect.Metric{Subsystem: sub, Name: "store_calls_total", Type: prometheus.CounterValue,
			Help: "Calls of the store's lookup, batch lookups included."},
			func(s *guarded.Stats) float64 { return float64(s.StoreCalls) }).
		Add(collect.Metric{Subsystem: sub, Name: "store_batch_calls_total", Type: prometheus.CounterValue,
			Help: "Calls of the store's batch lookup."},
			func(s *guarded.Stats) float64 { return float64(s.BatchCalls) }).
		Add(collect.Metric{Subsystem: sub, Name: "pass_through_shards", Type: prometheus.GaugeValue,
			Help: "Shards whose lookups pass through to the store until the next rebuild (a key they could not take)."},
			func(s *guarded.Stats) float64 { return float64(s.PassThroughShards) }).
		Add(collect.Metric{Subsystem: sub, Name: "unsettled_keys", Type: prometheus.GaugeValue,
			Help: "Keys of inserts whose outcome is unknown, kept through rebuilds until settled (WithUnsettled)."},
			func(s *guarded.Stats) float64 { return float64(s.Unsettled) }).
		Add(collect.Metric{Subsystem: sub, Name: "unsettled_overflows_total", Type: prometheus.CounterValue,
			Help: "Inserts of unknown outcome beyond WithUnsettled's max: the rebuilds after one pass lookups through for a while."},
			func(s *guarded.Stats) float64 { return float64(s.UnsettledOverflows) }).
		Add(collect.Metric{Subsystem: sub, Name: "rebuilding", Type: prometheus.GaugeValue,
			Help: "1 while a rebuild runs."},
			func(s *guarded.Stats) float64 { return collect.Bool(s.Rebuilding) }).
		Add(rebuilds, func(s *guarded.Stats) float64 { return float64(s.Rebuilds) }, "ok").
		Add(rebuilds, func(s *guarded.Stats) float64 { return float64(s.RebuildErrors) }, "error").
		Add(tokens, func(s *guarded.Stats) float64 {
			return float64(s.TokenLookups - min(s.TokenLookups, s.TokenWaits+s.TokenForeign))
		}, "reached").
		Add(tokens, func(s *guarded.Stats) float64 { return float64(s.TokenWaits - min(s.TokenWaits, s.TokenPassed)) }, "waited").
		Add(tokens, func(s *guarded.Stats) float64 { return float64(s.TokenPassed) }, "passed_through").
		Add(tokens, func(s *guarded.Stats) float64 { return float64(s.TokenForeign) }, "foreign")
	addGuard(c, func(s *guarded.Stats) *guard.Stats { return &s.Guard })
	return c
}

// NewMiddlewareCollector returns a collector of the cuckooguard_http_*
// metrics of m.
func NewMiddlewareCollector(m MiddlewareStatser, opts ...Option) prometheus.Collector {
	c := newCollector("NewMiddlewareCollector", m, func() middleware.Stats { return m.Stats() }, opts)
	const sub = "http"
	requests := collect.Metric{Subsystem: sub, Name: "requests_total", Type: prometheus.CounterValue, Labels: []string{"result"},
		Help: `Requests seen by the middleware by result: "rejected" (404 without the handler), "passed" (the key may exist), "missing_key", "unfiltered" (a method not filtered).`}
	tokens := collect.Metric{Subsystem: sub, Name: "tokens_total", Type: prometheus.CounterValue, Labels: []string{"result"},
		Help: `Consistency tokens: "read" from requests, "refused" (a token that did not read: the request passed through), "set" on the responses of writes.`}
	c.Add(requests, func(s *middleware.Stats) float64 { return float64(s.Rejected) }, "rejected").
		Add(requests, func(s *middleware.Stats) float64 { return float64(s.Passed) }, "passed").
		Add(requests, func(s *middleware.Stats) float64 { return float64(s.MissingKey) }, "missing_key").
		Add(requests, func(s *middleware.Stats) float64 { return float64(s.Unfiltered) }, "unfiltered").
		Add(collect.Metric{Subsystem: sub, Name: "false_positives_total", Type: prometheus.CounterValue,
			Help: "Requests passed to the handler that answered 404."},
			func(s *middleware.Stats) float64 { return float64(s.FalsePositives) }).
		Add(tokens, func(s *middleware.Stats) float64 { return float64(s.Tokens - min(s.Tokens, s.TokensRefused)) }, "read").
		Add(tokens, func(s *middleware.Stats) float64 { return float64(s.TokensRefused) }, "refused").
		Add(tokens, func(s *middleware.Stats) float64 { return float64(s.TokensSet) }, "set")
	return c
}

// addGuard adds the cuckooguard_guard_* metrics, read from the guard.Stats
// that g finds in S.
func addGuard[S any](c *collect.Collector[S], g func(*S) *guard.Stats) {
	const sub = "guard"
	gauge := func(name, help string, v func(*guard.Stats) float64) {
		c.Add(collect.Metric{Subsystem: sub, Name: name, Help: help, Type: prometheus.GaugeValue},
			func(s *S) float64 { return v(g(s)) })
	}
	counter := func(name, help string, v func(*guard.Stats) float64, labels ...string) {
		m := collect.Metric{Subsystem: sub, Name: name, Help: help, Type: prometheus.CounterValue}
		if len(labels) > 0 {
			m.Labels = []string{labels[0]}
			labels = labels[1:]
		}
		c.Add(m, func(s *S) float64 { return v(g(s)) }, labels...)
	}
	gauge("items", "Keys in the guard, counting repeated adds of one key.",
		func(s *guard.Stats) float64 { return float64(s.Items) })
	gauge("slots", "Fingerprint slots over all shards.",
		func(s *guard.Stats) float64 { return float64(s.Slots) })
	gauge("occupied_slots", "Occupied slots: the items plus the extra copies of entries whose fingerprints ran out of bits.",
		func(s *guard.Stats) float64 { return float64(s.Copies) })
	gauge("void_slots", "Occupied slots whose entries have no tail bits left.",
		func(s *guard.Stats) float64 { return float64(s.VoidCopies) })
	gauge("load_factor", "Occupied slots divided by slots.",
		func(s *guard.Stats) float64 { return s.LoadFactor })
	gauge("estimated_false_positive_ratio", "Expected share of lookups of absent keys that the guard lets through.",
		func(s *guard.Stats) float64 { return s.EstimatedFPR })
	gauge("memory_bytes", "Memory of the guard, its shards and their tables.",
		func(s *guard.Stats) float64 { return float64(s.Bytes) })
	gauge("memory_limit_bytes", "The memory cap (WithMaxBytes); 0 for none.",
		func(s *guard.Stats) float64 { return float64(s.MaxBytes) })
	gauge("memory_reserved_bytes", "What the memory cap counts: the memory of the guard with every stash counted full.",
		func(s *guard.Stats) float64 { return float64(s.ReservedBytes) })
	gauge("shards", "Shards of the guard.",
		func(s *guard.Stats) float64 { return float64(s.Shards) })
	gauge("saturated_shards", "Shards whose table uses every position bit and can no longer double.",
		func(s *guard.Stats) float64 { return float64(s.SaturatedShards) })
	gauge("degraded_shards", "Shards that refused an add with ErrFull, or were marked so (Guard.MarkDegraded; snapshots keep the marks): a Loader passes their lookups through until a rebuild.",
		func(s *guard.Stats) float64 { return float64(s.DegradedShards) })
	counter("adds_total", "Successful adds.",
		func(s *guard.Stats) float64 { return float64(s.Adds) })
	counter("removes_total", "Successful removes.",
		func(s *guard.Stats) float64 { return float64(s.Removes) })
	const addErrHelp = `Adds refused, by reason: "full" (no room within the memory cap) or "too_many_copies" (one key added more times than the guard keeps).`
	counter("add_errors_total", addErrHelp, func(s *guard.Stats) float64 { return float64(s.AddFailures) }, "reason", "full")
	counter("add_errors_total", addErrHelp, func(s *guard.Stats) float64 { return float64(s.DuplicatesRefused) }, "reason", "too_many_copies")
	counter("read_retries_total", "Lookups that read again because a writer moved an entry under them.",
		func(s *guard.Stats) float64 { return float64(s.ReadRetries) })
	counter("doublings_total", "Shard doublings.",
		func(s *guard.Stats) float64 { return float64(s.Doublings) })
	gauge("migrations_in_flight", "Background doublings running.",
		func(s *guard.Stats) float64 { return float64(s.MigrationsInFlight) })
	gauge("migrations_queued", "Shards waiting for a background worker to double them.",
		func(s *guard.Stats) float64 { return float64(s.MigrationsQueued) })
	counter("migrations_refused_total", "Doublings refused by the memory cap.",
		func(s *guard.Stats) float64 { return float64(s.MigrationsRefused) })
	counter("migration_seconds_total", "Time background workers spent doubling shards.",
		func(s *guard.Stats) float64 { return s.TimeMigrating.Seconds() })
}
