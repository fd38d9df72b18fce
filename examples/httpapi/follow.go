package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/metrics/pgmetrics"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// follow sets up how this replica keeps its guard in step with table:
// a postgres.Follower of its own (a slot and a walsender per replica), or
// with cfg.NATS a fanout.Relay and fanout.Follower (one slot for every
// replica: one of them relays the table's changes to JetStream, and all
// of them follow the stream).
func (a *app) follow(cfg config, table string) error {
	parse := func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
	if cfg.NATS == "" {
		fopts := []postgres.Option{postgres.WithLogger(a.log)}
		if cfg.Origin != "" {
			fopts = append(fopts, postgres.WithOrigin(cfg.Origin))
		}
		if cfg.Heartbeat > 0 {
			fopts = append(fopts, postgres.WithHeartbeat(cfg.Heartbeat))
		}
		if cfg.Notify {
			fopts = append(fopts, postgres.WithNotify())
		}
		if cfg.Snapshot != "" {
			fopts = append(fopts, postgres.WithSnapshotFile(cfg.Snapshot))
		}
		f, err := postgres.NewFollower(a.loader, cfg.DSN, table, "id", parse, fopts...)
		if err != nil {
			return err
		}
		a.follower = f
		// This replica's inserts are tagged so that its follower skips
		// them: its Loader adds their ids before writing.
		a.db.Tag = f.TagQuery
		return nil
	}
	if cfg.Notify || cfg.Snapshot != "" {
		return errors.New("-nats follows through the relay: -notify and -snapshot are for the direct follower (the relay's replica saves the guard to JetStream instead)")
	}
	if cfg.Origin == "" {
		return errors.New("-nats needs -origin: the relay's stream names the replica that tagged an insert")
	}
	nc, err := nats.Connect(cfg.NATS, nats.Name("cuckooguard httpapi "+cfg.Origin), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("-nats %s: %w", cfg.NATS, err)
	}
	a.nc = nc
	opts := []fanout.Option{fanout.WithLogger(a.log)}
	if cfg.Heartbeat > 0 {
		opts = append(opts, fanout.WithHeartbeat(cfg.Heartbeat))
	}
	// One relay per database and schema: the replicas of this service
	// take turns, by the relay's lock, and share its slot.
	if a.relay, err = fanout.NewRelay(cfg.DSN, "httpapi "+table, nc, []postgres.SourceTable{{Table: table, Key: "id"}}, opts...); err != nil {
		return err
	}
	// The replica that relays saves its guard to JetStream's object store
	// every minute: a new replica starts from it and reads nothing from
	// the table.
	fopts := append(opts, fanout.WithOrigin(cfg.Origin), fanout.WithSnapshots(fanout.DefaultBucket, time.Minute, a.relay.Leading))
	if a.relayed, err = fanout.NewFollower(a.loader, nc, cfg.DSN, table, "id", parse, fopts...); err != nil {
		return err
	}
	a.db.Tag = a.relayed.TagQuery
	return nil
}

// closeNATS closes the NATS connection, if any, once the relay and the
// follower have stopped.
func (a *app) closeNATS() {
	if a.nc != nil {
		a.nc.Close()
	}
}

// relayCollector exports what the replica's relay and stream follower
// do: the follower's state and lag as cuckooguard_follower_state and
// cuckooguard_follower_lag_seconds (the direct follower's names and
// meanings), and the rest under cuckooguard_fanout_*.
func relayCollector(f *fanout.Follower[int64], r *fanout.Relay) prometheus.Collector {
	return &fanoutCollector{f: f, r: r,
		state: prometheus.NewDesc("cuckooguard_follower_state", `1 for the follower's current state, 0 for the others. Lookups pass through in every state but "following".`, []string{"state"}, nil),
		lag:   prometheus.NewDesc("cuckooguard_follower_lag_seconds", "Round trip of the last heartbeat through the database, the relay and the stream, or, if longer, how long nothing has confirmed the guard.", nil, nil),
		applied: prometheus.NewDesc("cuckooguard_fanout_transactions_total", `Transactions from the stream, by result: "applied", or "skipped" (this replica's own inserts, or seen by the last read).`,
			[]string{"result"}, nil),
		reads:    prometheus.NewDesc("cuckooguard_fanout_full_reads_total", "Reads of the whole table, by why.", []string{"reason"}, nil),
		failures: prometheus.NewDesc("cuckooguard_fanout_session_failures_total", "Follower sessions that ended in an error, by what ended them.", []string{"reason"}, nil),
		leading:  prometheus.NewDesc("cuckooguard_fanout_relay_leading", "1 while this replica is the relay.", nil, nil),
		publish:  prometheus.NewDesc("cuckooguard_fanout_relay_published_total", "Messages this replica published as the relay.", nil, nil),
	}
}

type fanoutCollector struct {
	f                                                      *fanout.Follower[int64]
	r                                                      *fanout.Relay
	state, lag, applied, reads, failures, leading, publish *prometheus.Desc
}

func (c *fanoutCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.state, c.lag, c.applied, c.reads, c.failures, c.leading, c.publish} {
		ch <- d
	}
}

func (c *fanoutCollector) Collect(ch chan<- prometheus.Metric) {
	st, rs := c.f.Stats(), c.r.Stats()
	for _, s := range pgmetrics.States {
		v := 0.0
		if st.State == s {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, v, s.String())
	}
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, st.Lag.Seconds())
	ch <- prometheus.MustNewConstMetric(c.applied, prometheus.CounterValue, float64(st.Applied), "applied")
	ch <- prometheus.MustNewConstMetric(c.applied, prometheus.CounterValue, float64(st.Skipped), "skipped")
	for why, n := range st.Reads {
		ch <- prometheus.MustNewConstMetric(c.reads, prometheus.CounterValue, float64(n), why)
	}
	for why, n := range st.Failures {
		ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(n), why)
	}
	leading := 0.0
	if rs.Leading {
		leading = 1
	}
	ch <- prometheus.MustNewConstMetric(c.leading, prometheus.GaugeValue, leading)
	ch <- prometheus.MustNewConstMetric(c.publish, prometheus.CounterValue, float64(rs.Published))
}
