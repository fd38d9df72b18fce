// Package mysqlmetrics exports the statistics of a mysql.Follower (a
// MySQL or MariaDB table followed from the binlog) as Prometheus metrics.
// It is apart from package metrics so that services without MySQL do not
// build its client.
//
// The metrics that mean what the PostgreSQL follower's do keep its names
// (package pgmetrics), so that the README's alerts on them hold for either
// database; those of the binlog alone are under cuckooguard_mysql_*. A
// process runs one kind of follower per registry: register this package's
// collector or pgmetrics', not both in one registry (the lag and the
// reads share names with other help texts or labels, which a registry
// refuses).
//
// The metrics, with the default namespace "cuckooguard":
//
//	cuckooguard_follower_state{state}                        gauge    1 for the current state, 0 for the others:
//	                                                                  "following", "behind", "resyncing", "pass-through"
//	cuckooguard_follower_lag_seconds                         gauge    round trip of the last heartbeat through the binlog
//	cuckooguard_follower_current_as_of_timestamp_seconds     gauge    every change committed before it has been applied (0: never)
//	cuckooguard_follower_notifications_total{result}         counter  binlog changes: "applied", or "skipped" (own inserts, Follower.Tag)
//	cuckooguard_follower_full_reads_total{reason}            counter  reads of the whole table, by Reasons
//	cuckooguard_follower_session_failures_total              counter  sessions that ended (mysql.Stats has no reasons: the log has them)
//	cuckooguard_follower_heartbeats_total                    counter  heartbeats written
//	cuckooguard_follower_snapshots_total                     counter  snapshot files written
//	cuckooguard_follower_snapshot_starts_total               counter  guards restored from the snapshot file instead of a full read
//	cuckooguard_mysql_resumes_total                          counter  sessions that streamed on from a proven position, without a read
//	cuckooguard_mysql_server_id                              gauge    the server id the follower's binlog stream registers with
package mysqlmetrics

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/internal/collect"
	"github.com/cuckooguard/cuckooguard/mysql"
)

// FollowerStatser is what [NewFollowerCollector] watches: any
// *mysql.Follower.
type FollowerStatser interface{ Stats() mysql.Stats }

// States lists the values of the state label, in the order of
// mysql.State.
var States = []mysql.State{mysql.PassThrough, mysql.Resyncing, mysql.Following, mysql.Behind}

// The values of the reason label of cuckooguard_follower_full_reads_total.
// mysql.Stats gives the number of reads and the reason of the last one
// (a text); the collector sorts each read it sees into one of these.
const (
	ReasonStart           = "start"            // the first session of the process, without a snapshot file
	ReasonSnapshotMissing = "snapshot_missing" // the first session, whose snapshot file is not there (a first start)
	ReasonSnapshotBad     = "snapshot_bad"     // the snapshot file could not be used: damaged, of another table, or a position the server cannot prove
	ReasonOther           = "other"            // anything else: DDL, a purged or reset binlog, a session that could not resume (the follower's log says which)
)

// Reasons lists the values of the reason label of
// cuckooguard_follower_full_reads_total.
var Reasons = []string{ReasonStart, ReasonSnapshotMissing, ReasonSnapshotBad, ReasonOther}

// reasonOf sorts the text of mysql.Stats.ReadReason into Reasons.
func reasonOf(text string) string {
	switch {
	case text == "the first session":
		return ReasonStart
	case strings.HasPrefix(text, "snapshot file: ") && strings.Contains(text, "no such file"):
		return ReasonSnapshotMissing
	case strings.HasPrefix(text, "snapshot file: "):
		return ReasonSnapshotBad
	}
	return ReasonOther
}

// reads counts a follower's reads of the whole table by reason, from the
// statistics of each scrape: mysql.Stats holds the number of reads and
// the reason of the last one only, so the reads a scrape finds since the
// last are counted under the last one's reason. Two reads between two
// scrapes (each takes a session at least) are counted under the later
// one's reason.
type reads struct {
	mu       sync.Mutex // protects seen and byReason
	seen     int64
	byReason map[string]int64
}

// stats returns st with its reads counted by reason, in a map of its own.
func (r *reads) stats(st mysql.Stats) stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.FullReads > r.seen {
		r.byReason[reasonOf(st.ReadReason)] += st.FullReads - r.seen
		r.seen = st.FullReads
	}
	out := stats{Stats: st, reads: make(map[string]int64, len(r.byReason))}
	for k, v := range r.byReason {
		out.reads[k] = v
	}
	return out
}

// stats is a scrape's statistics.
type stats struct {
	mysql.Stats
	reads map[string]int64
}

// NewFollowerCollector returns a collector of the metrics of f: the
// cuckooguard_follower_* names of pgmetrics where they mean the same, and
// cuckooguard_mysql_*. Register the collector of the follower's Loader
// ([metrics.NewLoaderCollector]) next to it. Make it before the
// follower's Run reads the table, so that the first read is counted under
// its reason (ReasonStart). It panics if f is nil.
func NewFollowerCollector(f FollowerStatser, opts ...metrics.Option) prometheus.Collector {
	if collect.IsNil(f) {
		panic("mysqlmetrics: NewFollowerCollector: nothing to watch (nil)")
	}
	s := metrics.Apply(opts)
	r := &reads{byReason: make(map[string]int64)}
	c := collect.New(s.Namespace, s.ConstLabels, func() stats { return r.stats(f.Stats()) })
	const sub = "follower"
	type S = stats
	state := collect.Metric{Subsystem: sub, Name: "state", Type: prometheus.GaugeValue, Labels: []string{"state"},
		Help: `1 for the follower's current state, 0 for the others. Lookups pass through in every state but "following".`}
	for _, st := range States {
		c.Add(state, func(s *S) float64 { return collect.Bool(s.State == st) }, st.String())
	}
	c.Add(collect.Metric{Subsystem: sub, Name: "lag_seconds", Type: prometheus.GaugeValue,
		Help: "Round trip of the last heartbeat (or marker) through the database and its binlog. The guard answers on a heartbeat's evidence up to the max lag after it was written (150 ms by default)."},
		func(s *S) float64 { return s.Lag.Seconds() }).
		Add(collect.Metric{Subsystem: sub, Name: "current_as_of_timestamp_seconds", Type: prometheus.GaugeValue,
			Help: "Unix time before which every committed change has been applied: when the last heartbeat back was written; 0 if none has come back."},
			func(s *S) float64 { return collect.Timestamp(s.CurrentAsOf) })
	notifications := collect.Metric{Subsystem: sub, Name: "notifications_total", Type: prometheus.CounterValue, Labels: []string{"result"},
		Help: `Changes from the binlog by result: "applied", or "skipped" (this process's own inserts, tagged with Follower.Tag).`}
	c.Add(notifications, func(s *S) float64 { return float64(s.Applied) }, "applied").
		Add(notifications, func(s *S) float64 { return float64(s.Skipped) }, "skipped")
	fullReads := collect.Metric{Subsystem: sub, Name: "full_reads_total", Type: prometheus.CounterValue, Labels: []string{"reason"},
		Help: `Reads of the whole table, by why: "start" and "snapshot_missing" are a process's first; "snapshot_bad" (the snapshot file could not be used) and "other" (DDL or TRUNCATE on the table, a purged or reset binlog, a position that could not be proved: the follower's log says which) are worth a look when they repeat.`}
	for _, reason := range Reasons {
		c.Add(fullReads, func(s *S) float64 { return float64(s.reads[reason]) }, reason)
	}
	c.Add(collect.Metric{Subsystem: sub, Name: "session_failures_total", Type: prometheus.CounterValue,
		Help: "Follower sessions that ended in an error: a lost connection, a server restart, another reader with the follower's server id, a heartbeat that did not come back, a setup that cannot work. The follower's log says which."},
		func(s *S) float64 { return float64(s.Failures) }).
		Add(collect.Metric{Subsystem: sub, Name: "heartbeats_total", Type: prometheus.CounterValue,
			Help: "Heartbeats written to the database."},
			func(s *S) float64 { return float64(s.Heartbeats) }).
		Add(collect.Metric{Subsystem: sub, Name: "snapshots_total", Type: prometheus.CounterValue,
			Help: "Snapshot files the follower wrote: its guard with the position it reflects."},
			func(s *S) float64 { return float64(s.Snapshots) }).
		Add(collect.Metric{Subsystem: sub, Name: "snapshot_starts_total", Type: prometheus.CounterValue,
			Help: "Sessions that started from the snapshot file instead of reading the table."},
			func(s *S) float64 { return float64(s.Restores) })
	const my = "mysql"
	c.Add(collect.Metric{Subsystem: my, Name: "resumes_total", Type: prometheus.CounterValue,
		Help: "Sessions that streamed the binlog on from where the last one stopped (or from the snapshot file's position), once proved, without reading the table."},
		func(s *S) float64 { return float64(s.Resumes) }).
		Add(collect.Metric{Subsystem: my, Name: "server_id", Type: prometheus.GaugeValue,
			Help: "The server id the follower's binlog stream registers with: every reader of a server's binlog needs its own (a second one with the same id disconnects the first, error 4052)."},
			func(s *S) float64 { return float64(s.ServerID) })
	return c
}
