// Package pgmetrics exports the statistics of a postgres.Follower as
// Prometheus metrics. It is apart from package metrics so that services
// without PostgreSQL do not build its driver.
//
// The metrics, with the default namespace "cuckooguard":
//
//	cuckooguard_follower_state{state}                      gauge    1 for the current state, 0 for the others:
//	                                                                "following", "behind", "resyncing", "pass-through"
//	cuckooguard_follower_lag_seconds                       gauge    heartbeat round trip, or the time nothing has confirmed the guard
//	cuckooguard_follower_notifications_total{result}       counter  "applied", or "skipped" (own inserts, seen by the read)
//	cuckooguard_follower_resyncs_total                     counter  reads of the whole table
//	cuckooguard_follower_full_reads_total{reason}          counter  reads of the whole table, by postgres.ReadReason
//	cuckooguard_follower_slot_retained_bytes               gauge    WAL the follower's replication slot holds on the server
//	cuckooguard_follower_snapshots_total                   counter  snapshot files written
//	cuckooguard_follower_snapshot_starts_total             counter  sessions started from the snapshot file instead of a full read
//	cuckooguard_follower_session_failures_total{reason}    counter  sessions that ended in an error, by postgres.Reason
//	cuckooguard_follower_retry_delay_seconds               gauge    the wait before the last reconnect
//	cuckooguard_follower_heartbeats_total                  counter  heartbeats sent
//	cuckooguard_follower_heartbeats_lost_total             counter  sessions given up: nothing came back within the deadline
//	cuckooguard_follower_last_heartbeat_timestamp_seconds  gauge    when the last heartbeat came back (0: never)
//	cuckooguard_follower_last_applied_timestamp_seconds    gauge    when the last notification was applied (0: never)
//	cuckooguard_follower_decoding_behind_bytes             gauge    WAL the server has yet to decode while the follower waits for it (a bulk load); 0 otherwise
//	cuckooguard_follower_busy_waits_total                  counter  times the follower waited for a busy walsender instead of reconnecting
package pgmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/internal/collect"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// FollowerStatser is what [NewFollowerCollector] watches: any
// *postgres.Follower.
type FollowerStatser interface{ Stats() postgres.FollowerStats }

// States lists the values of the state label, in the order of
// postgres.State.
var States = []postgres.State{postgres.PassThrough, postgres.Resyncing, postgres.Following, postgres.Behind}

// NewFollowerCollector returns a collector of the cuckooguard_follower_*
// metrics of f. Register the collector of the follower's Loader
// ([metrics.NewLoaderCollector]) next to it.
func NewFollowerCollector(f FollowerStatser, opts ...metrics.Option) prometheus.Collector {
	if collect.IsNil(f) {
		panic("pgmetrics: NewFollowerCollector: nothing to watch (nil)")
	}
	s := metrics.Apply(opts)
	c := collect.New(s.Namespace, s.ConstLabels, f.Stats)
	const sub = "follower"
	type S = postgres.FollowerStats
	state := collect.Metric{Subsystem: sub, Name: "state", Type: prometheus.GaugeValue, Labels: []string{"state"},
		Help: `1 for the follower's current state, 0 for the others. Lookups pass through in every state but "following".`}
	for _, st := range States {
		c.Add(state, func(s *S) float64 { return collect.Bool(s.State == st) }, st.String())
	}
	notifications := collect.Metric{Subsystem: sub, Name: "notifications_total", Type: prometheus.CounterValue, Labels: []string{"result"},
		Help: `Change notifications by result: "applied", or "skipped" (this process's own inserts, or changes the last read already saw).`}
	c.Add(collect.Metric{Subsystem: sub, Name: "lag_seconds", Type: prometheus.GaugeValue,
		Help: "Round trip of the last heartbeat through the database, or, if longer, how long nothing has confirmed the guard: the age of the oldest heartbeat not back yet, or the time since the last session ended."},
		func(s *S) float64 { return s.Lag.Seconds() }).
		Add(notifications, func(s *S) float64 { return float64(s.Applied) }, "applied").
		Add(notifications, func(s *S) float64 { return float64(s.Skipped) }, "skipped").
		Add(collect.Metric{Subsystem: sub, Name: "resyncs_total", Type: prometheus.CounterValue,
			Help: "Completed reads of the whole table into a fresh guard."},
			func(s *S) float64 { return float64(s.Resyncs) }).
		Add(collect.Metric{Subsystem: sub, Name: "retry_delay_seconds", Type: prometheus.GaugeValue,
			Help: "The wait before the follower's last reconnect: the first delay after a healthy session, doubled by each failed one up to 30 s."},
			func(s *S) float64 { return s.RetryDelay.Seconds() }).
		Add(collect.Metric{Subsystem: sub, Name: "heartbeats_total", Type: prometheus.CounterValue,
			Help: "Heartbeats sent through the database."},
			func(s *S) float64 { return float64(s.Heartbeats) }).
		Add(collect.Metric{Subsystem: sub, Name: "heartbeats_lost_total", Type: prometheus.CounterValue,
			Help: "Sessions given up because nothing came back within the heartbeat deadline on a silent connection (for logical decoding: while the walsender was not at work)."},
			func(s *S) float64 { return float64(s.HeartbeatsLost) }).
		Add(collect.Metric{Subsystem: sub, Name: "last_heartbeat_timestamp_seconds", Type: prometheus.GaugeValue,
			Help: "Unix time at which the last heartbeat came back; 0 if none has."},
			func(s *S) float64 { return collect.Timestamp(s.LastHeartbeat) }).
		Add(collect.Metric{Subsystem: sub, Name: "last_applied_timestamp_seconds", Type: prometheus.GaugeValue,
			Help: "Unix time at which the last notification was applied; 0 if none has been."},
			func(s *S) float64 { return collect.Timestamp(s.LastApplied) })
	c.Add(collect.Metric{Subsystem: sub, Name: "decoding_behind_bytes", Type: prometheus.GaugeValue,
		Help: "While the follower's stream is silent because the server is still decoding WAL before the table's next change (a bulk load), the bytes of WAL it had yet to decode; 0 otherwise. The follower waits, behind, rather than reconnect and decode it again."},
		func(s *S) float64 { return float64(s.DecodingBehind) }).
		Add(collect.Metric{Subsystem: sub, Name: "busy_waits_total", Type: prometheus.CounterValue,
			Help: "Times the follower waited for a walsender at work instead of calling its silent stream dead."},
			func(s *S) float64 { return float64(s.BusyWaits) })
	reads := collect.Metric{Subsystem: sub, Name: "full_reads_total", Type: prometheus.CounterValue, Labels: []string{"reason"},
		Help: `Reads of the whole table, by why they were needed: "start", "snapshot_missing", "snapshot_bad", "snapshot_stale", "slot_missing", "slot_lost", "requested", "truncated", "big_transaction", "no_resume", "resume_failed", "slot_moved", "publication_changed", "table_changed" (the table's name resolved to another table), "rewound" (the server's WAL ended before the follower's position: a restored database). Every reason but "start" and "snapshot_missing" (and "requested", the Loader's) says something went wrong.`}
	for _, r := range postgres.ReadReasons {
		c.Add(reads, func(s *S) float64 { return float64(s.FullReads[r]) }, string(r))
	}
	c.Add(collect.Metric{Subsystem: sub, Name: "slot_retained_bytes", Type: prometheus.GaugeValue,
		Help: "WAL the follower's replication slot holds on the server, from its restart position to the server's current one (read every 30 s; logical decoding)."},
		func(s *S) float64 { return float64(s.SlotRetained) }).
		Add(collect.Metric{Subsystem: sub, Name: "snapshots_total", Type: prometheus.CounterValue,
			Help: "Snapshot files the follower wrote: its guard with the position it reflects."},
			func(s *S) float64 { return float64(s.Snapshots) }).
		Add(collect.Metric{Subsystem: sub, Name: "snapshot_starts_total", Type: prometheus.CounterValue,
			Help: "Sessions that started from the snapshot file instead of reading the table."},
			func(s *S) float64 { return float64(s.SnapshotStart) })
	failures := collect.Metric{Subsystem: sub, Name: "session_failures_total", Type: prometheus.CounterValue, Labels: []string{"reason"},
		Help: `Follower sessions that ended in an error, by reason: "connect", "listen", "not_installed", "resync", "no_notifications" (the connection cannot LISTEN, as through a transaction-pooling PgBouncer), "connection_lost", "heartbeat_lost" (a silent connection whose walsender was not at work), "notification", "setup", "slot", "publication" (the publication changed under it), "terminated" (the server ended it: pg_terminate_backend, a shutdown or restart), "table_changed" (the table's name resolved to another table under it: a rename swap, a DROP and CREATE).`}
	for _, r := range postgres.Reasons {
		c.Add(failures, func(s *S) float64 { return float64(s.FailuresByReason[r]) }, string(r))
	}
	return c
}
