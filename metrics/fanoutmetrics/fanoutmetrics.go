// Package fanoutmetrics exports the statistics of a fanout.Follower and a
// fanout.Relay as Prometheus metrics. It is apart from package metrics so
// that services without NATS do not build its client.
//
// The follower's state and lag keep the direct follower's names and
// meanings (package pgmetrics), so that the README's alerts on them hold
// for either follower; the rest is under cuckooguard_fanout_*. A process
// runs one kind of follower per table: register this package's follower
// collector or pgmetrics', not both in one registry (their lag metrics
// share a name with different help texts, which a registry refuses).
//
// The metrics, with the default namespace "cuckooguard":
//
//	cuckooguard_follower_state{state}                         gauge    1 for the current state, 0 for the others:
//	                                                                   "following", "behind", "resyncing", "pass-through"
//	cuckooguard_follower_lag_seconds                          gauge    heartbeat round trip through database, relay and stream,
//	                                                                   or the time nothing has confirmed the guard
//	cuckooguard_fanout_transactions_total{result}             counter  "applied", or "skipped" (own inserts, seen by the last read)
//	cuckooguard_fanout_full_reads_total{reason}               counter  reads of the whole table, by fanout.ReadReasons
//	cuckooguard_fanout_session_failures_total{reason}         counter  sessions that ended in an error, by fanout.FailureReasons
//	cuckooguard_fanout_snapshot_starts_total                  counter  starts from a guard saved in the object store
//	cuckooguard_fanout_snapshots_saved_total                  counter  guards saved to the object store
//	cuckooguard_fanout_current_as_of_timestamp_seconds        gauge    every change committed before it has been applied (0: never)
//	cuckooguard_fanout_pending_messages                       gauge    messages of the table the stream holds for this follower, not delivered yet
//	cuckooguard_fanout_relay_silence_seconds                  gauge    how long no message of the table's subject has come: past the max lag,
//	                                                                   the relay (or the broker) stalls, where a follower that is only behind
//	                                                                   still gets messages
//	cuckooguard_fanout_fenced_messages_total                  counter  messages of a relay whose lease lapsed, ignored
//	cuckooguard_fanout_nats_connected                         gauge    1 while the follower's NATS connection is connected
//
//	cuckooguard_fanout_relay_leading                          gauge    1 while this process is the relay
//	cuckooguard_fanout_relay_terms_total                      counter  times this process became the relay
//	cuckooguard_fanout_relay_published_total                  counter  messages published
//	cuckooguard_fanout_relay_resets_total                     counter  resets published (the followers read the table again)
//	cuckooguard_fanout_relay_streaming                        gauge    1 while the relay's replication session streams
//	cuckooguard_fanout_relay_sessions_total                   counter  replication sessions started
//	cuckooguard_fanout_relay_session_failures_total           counter  replication sessions that ended in an error
//	cuckooguard_fanout_relay_commits_total                    counter  committed transactions relayed
//	cuckooguard_fanout_relay_slot_retained_bytes              gauge    WAL the relay's slot holds on the server (as of the relay's last
//	                                                                   heartbeat; 0 on a process that does not relay)
//	cuckooguard_fanout_relay_lease_lapses_total               counter  terms that ended because this process did not renew its lease in time
package fanoutmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/internal/collect"
	"github.com/cuckooguard/cuckooguard/metrics/pgmetrics"
)

// FollowerStatser is what [NewFollowerCollector] watches: any
// *fanout.Follower.
type FollowerStatser interface{ Stats() fanout.Stats }

// RelayStatser is what [NewRelayCollector] watches: a *fanout.Relay.
type RelayStatser interface{ Stats() fanout.RelayStats }

// NewFollowerCollector returns a collector of the metrics of f: its state
// and lag under the direct follower's names, the rest under
// cuckooguard_fanout_*. Register the collector of the follower's Loader
// ([metrics.NewLoaderCollector]) next to it. It panics if f is nil.
func NewFollowerCollector(f FollowerStatser, opts ...metrics.Option) prometheus.Collector {
	if collect.IsNil(f) {
		panic("fanoutmetrics: NewFollowerCollector: nothing to watch (nil)")
	}
	s := metrics.Apply(opts)
	c := collect.New(s.Namespace, s.ConstLabels, f.Stats)
	type S = fanout.Stats
	state := collect.Metric{Subsystem: "follower", Name: "state", Type: prometheus.GaugeValue, Labels: []string{"state"},
		Help: `1 for the follower's current state, 0 for the others. Lookups pass through in every state but "following".`}
	for _, st := range pgmetrics.States {
		c.Add(state, func(s *S) float64 { return collect.Bool(s.State == st) }, st.String())
	}
	c.Add(collect.Metric{Subsystem: "follower", Name: "lag_seconds", Type: prometheus.GaugeValue,
		Help: "Round trip of the last heartbeat through the database, the relay and the stream, or, if longer, how long nothing has confirmed the guard."},
		func(s *S) float64 { return s.Lag.Seconds() })
	const sub = "fanout"
	tx := collect.Metric{Subsystem: sub, Name: "transactions_total", Type: prometheus.CounterValue, Labels: []string{"result"},
		Help: `Transactions from the stream, by result: "applied", or "skipped" (this process's own inserts, or seen by the last read).`}
	c.Add(tx, func(s *S) float64 { return float64(s.Applied) }, "applied").
		Add(tx, func(s *S) float64 { return float64(s.Skipped) }, "skipped")
	reads := collect.Metric{Subsystem: sub, Name: "full_reads_total", Type: prometheus.CounterValue, Labels: []string{"reason"},
		Help: `Reads of the whole table, by why: "start" and "requested" are routine; "reset", "reread" (a TRUNCATE or a transaction bigger than the relay holds back), "gap" (messages missing from the stream) and "stream" (the stream was deleted and made again) are worth a look when they repeat.`}
	for _, r := range fanout.ReadReasons {
		c.Add(reads, func(s *S) float64 { return float64(s.Reads[r]) }, r)
	}
	failures := collect.Metric{Subsystem: sub, Name: "session_failures_total", Type: prometheus.CounterValue, Labels: []string{"reason"},
		Help: `Follower sessions that ended in an error, by what ended them: "database", "stream" (the stream or its consumer), "nats" (the NATS connection went down), "setup" (the table or the stream cannot be found).`}
	for _, r := range fanout.FailureReasons {
		c.Add(failures, func(s *S) float64 { return float64(s.Failures[r]) }, r)
	}
	c.Add(collect.Metric{Subsystem: sub, Name: "snapshot_starts_total", Type: prometheus.CounterValue,
		Help: "Sessions that started from a guard saved in the object store instead of reading the table."},
		func(s *S) float64 { return float64(s.SnapshotStarts) }).
		Add(collect.Metric{Subsystem: sub, Name: "snapshots_saved_total", Type: prometheus.CounterValue,
			Help: "Guards this follower saved to the object store."},
			func(s *S) float64 { return float64(s.SnapshotsSaved) }).
		Add(collect.Metric{Subsystem: sub, Name: "current_as_of_timestamp_seconds", Type: prometheus.GaugeValue,
			Help: "Unix time before which every committed change has been applied; 0 if none has been confirmed yet."},
			func(s *S) float64 { return collect.Timestamp(s.CurrentAsOf) }).
		Add(collect.Metric{Subsystem: sub, Name: "pending_messages", Type: prometheus.GaugeValue,
			Help: "Messages of the table the stream holds for this follower and has not delivered yet."},
			func(s *S) float64 { return float64(s.Pending) }).
		Add(collect.Metric{Subsystem: sub, Name: "relay_silence_seconds", Type: prometheus.GaugeValue,
			Help: "How long no message of the table's subject has come. Every follower's heartbeats pass through it several times a second: past the max lag the relay, or the broker, stalls."},
			func(s *S) float64 { return s.RelaySilence.Seconds() }).
		Add(collect.Metric{Subsystem: sub, Name: "fenced_messages_total", Type: prometheus.CounterValue,
			Help: "Messages of a relay whose lease lapsed (an older term), ignored."},
			func(s *S) float64 { return float64(s.Fenced) }).
		Add(collect.Metric{Subsystem: sub, Name: "nats_connected", Type: prometheus.GaugeValue,
			Help: "1 while the follower's NATS connection is connected; 0 while it reconnects or is closed (lookups pass through)."},
			func(s *S) float64 { return collect.Bool(s.NATSConnected) })
	return c
}

// NewRelayCollector returns a collector of the cuckooguard_fanout_relay_*
// metrics of r, the relay a process campaigns for (exported whether or not
// it leads). It panics if r is nil.
func NewRelayCollector(r RelayStatser, opts ...metrics.Option) prometheus.Collector {
	if collect.IsNil(r) {
		panic("fanoutmetrics: NewRelayCollector: nothing to watch (nil)")
	}
	s := metrics.Apply(opts)
	c := collect.New(s.Namespace, s.ConstLabels, r.Stats)
	type S = fanout.RelayStats
	const sub = "fanout"
	c.Add(collect.Metric{Subsystem: sub, Name: "relay_leading", Type: prometheus.GaugeValue,
		Help: "1 while this process is the relay: it holds the advisory lock and streams the slot."},
		func(s *S) float64 { return collect.Bool(s.Leading) }).
		Add(collect.Metric{Subsystem: sub, Name: "relay_terms_total", Type: prometheus.CounterValue,
			Help: "Times this process became the relay."},
			func(s *S) float64 { return float64(s.Terms) }).
		Add(collect.Metric{Subsystem: sub, Name: "relay_published_total", Type: prometheus.CounterValue,
			Help: "Messages this process published as the relay."},
			func(s *S) float64 { return float64(s.Published) }).
		Add(collect.Metric{Subsystem: sub, Name: "relay_resets_total", Type: prometheus.CounterValue,
			Help: "Resets this process published as the relay: the followers of a table read it again."},
			func(s *S) float64 { return float64(s.Resets) }).
		Add(collect.Metric{Subsystem: sub, Name: "relay_streaming", Type: prometheus.GaugeValue,
			Help: "1 while the relay's replication session streams."},
			func(s *S) float64 { return collect.Bool(s.Source.Streaming) }).
		Add(collect.Metric{Subsystem: sub, Name: "relay_sessions_total", Type: prometheus.CounterValue,
			Help: "Replication sessions the relay started."},
			func(s *S) float64 { return float64(s.Source.Sessions) }).
		Add(collect.Metric{Subsystem: sub, Name: "relay_session_failures_total", Type: prometheus.CounterValue,
			Help: "Replication sessions of the relay that ended in an error."},
			func(s *S) float64 { return float64(s.Source.Failures) }).
		Add(collect.Metric{Subsystem: sub, Name: "relay_commits_total", Type: prometheus.CounterValue,
			Help: "Committed transactions the relay passed on."},
			func(s *S) float64 { return float64(s.Source.Commits) }).
		Add(collect.Metric{Subsystem: sub, Name: "relay_slot_retained_bytes", Type: prometheus.GaugeValue,
			Help: "WAL the relay's replication slot holds on the server, as of the relay's last heartbeat (0 where this process does not relay)."},
			func(s *S) float64 {
				if !s.Leading {
					return 0
				}
				return float64(s.Source.Retained)
			}).
		Add(collect.Metric{Subsystem: sub, Name: "relay_lease_lapses_total", Type: prometheus.CounterValue,
			Help: "Terms that ended because this process did not renew its lease in time (a pause longer than the lease): another replica may have taken over."},
			func(s *S) float64 { return float64(s.Lapsed) })
	return c
}
