package fanoutmetrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/fanoutmetrics"
	"github.com/cuckooguard/cuckooguard/metrics/internal/metricstest"
	"github.com/cuckooguard/cuckooguard/metrics/pgmetrics"
	"github.com/cuckooguard/cuckooguard/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A *fanout.Follower and a *fanout.Relay are what the collectors watch.
var (
	_ fanoutmetrics.FollowerStatser = (*fanout.Follower[int64])(nil)
	_ fanoutmetrics.RelayStatser    = (*fanout.Relay)(nil)
)

// fixedFollower and fixedRelay are a follower and a relay whose
// statistics the test sets.
type fixedFollower struct{ st fanout.Stats }

func (f *fixedFollower) Stats() fanout.Stats { return f.st }

type fixedRelay struct{ st fanout.RelayStats }

func (r *fixedRelay) Stats() fanout.RelayStats { return r.st }

func TestCollectors(t *testing.T) {
	asOf := time.Unix(1_700_000_000, 500_000_000)
	f := &fixedFollower{fanout.Stats{
		State: postgres.Behind, Lag: 250 * time.Millisecond, CurrentAsOf: asOf,
		Applied: 1234, Skipped: 17, Seq: 99,
		Reads:          map[string]int64{"start": 1, "gap": 2},
		Failures:       map[string]int64{"stream": 3, "database": 1},
		SnapshotStarts: 4, SnapshotsSaved: 5,
		Fenced: 6, Pending: 7, RelaySilence: 1500 * time.Millisecond, NATSConnected: true,
	}}
	r := &fixedRelay{fanout.RelayStats{Leading: true, Terms: 2, Lapsed: 1, Published: 5000, Resets: 1,
		Source: follow.SourceStats{Streaming: true, Sessions: 3, Failures: 2, Commits: 4321, Retained: 1 << 20}}}
	reg := prometheus.NewPedanticRegistry()
	labels := metrics.WithConstLabels(prometheus.Labels{"table": "users"})
	reg.MustRegister(fanoutmetrics.NewFollowerCollector(f, labels), fanoutmetrics.NewRelayCollector(r, labels))
	gauge := func(v float64) metricstest.Sample { return metricstest.Sample{Type: metricstest.Gauge, Value: v} }
	counter := func(v float64) metricstest.Sample { return metricstest.Sample{Type: metricstest.Counter, Value: v} }
	want := map[string]metricstest.Sample{
		`cuckooguard_follower_state{state="pass-through",table="users"}`:        gauge(0),
		`cuckooguard_follower_state{state="resyncing",table="users"}`:           gauge(0),
		`cuckooguard_follower_state{state="following",table="users"}`:           gauge(0),
		`cuckooguard_follower_state{state="behind",table="users"}`:              gauge(1),
		`cuckooguard_follower_lag_seconds{table="users"}`:                       gauge(0.25),
		`cuckooguard_fanout_transactions_total{result="applied",table="users"}`: counter(1234),
		`cuckooguard_fanout_transactions_total{result="skipped",table="users"}`: counter(17),
		`cuckooguard_fanout_snapshot_starts_total{table="users"}`:               counter(4),
		`cuckooguard_fanout_snapshots_saved_total{table="users"}`:               counter(5),
		`cuckooguard_fanout_current_as_of_timestamp_seconds{table="users"}`:     gauge(1_700_000_000.5),
		`cuckooguard_fanout_relay_leading{table="users"}`:                       gauge(1),
		`cuckooguard_fanout_relay_terms_total{table="users"}`:                   counter(2),
		`cuckooguard_fanout_relay_published_total{table="users"}`:               counter(5000),
		`cuckooguard_fanout_relay_resets_total{table="users"}`:                  counter(1),
		`cuckooguard_fanout_relay_streaming{table="users"}`:                     gauge(1),
		`cuckooguard_fanout_relay_sessions_total{table="users"}`:                counter(3),
		`cuckooguard_fanout_relay_session_failures_total{table="users"}`:        counter(2),
		`cuckooguard_fanout_relay_commits_total{table="users"}`:                 counter(4321),
		`cuckooguard_fanout_fenced_messages_total{table="users"}`:               counter(6),
		`cuckooguard_fanout_pending_messages{table="users"}`:                    gauge(7),
		`cuckooguard_fanout_relay_silence_seconds{table="users"}`:               gauge(1.5),
		`cuckooguard_fanout_nats_connected{table="users"}`:                      gauge(1),
		`cuckooguard_fanout_relay_slot_retained_bytes{table="users"}`:           gauge(1 << 20),
		`cuckooguard_fanout_relay_lease_lapses_total{table="users"}`:            counter(1),
	}
	// Every reason from the first scrape, including those never seen.
	for _, why := range fanout.ReadReasons {
		want[`cuckooguard_fanout_full_reads_total{reason="`+why+`",table="users"}`] = counter(float64(f.st.Reads[why]))
	}
	for _, why := range fanout.FailureReasons {
		want[`cuckooguard_fanout_session_failures_total{reason="`+why+`",table="users"}`] = counter(float64(f.st.Failures[why]))
	}
	metricstest.Compare(t, metricstest.Gather(t, reg), want)
	metricstest.Lint(t, reg)

	// The state gauge follows the follower's state, one scrape at a time,
	// and a follower never confirmed exports 0 for current_as_of.
	f.st.CurrentAsOf = time.Time{}
	for _, st := range pgmetrics.States {
		f.st.State = st
		got := metricstest.Gather(t, reg)
		for _, other := range pgmetrics.States {
			k := `cuckooguard_follower_state{state="` + other.String() + `",table="users"}`
			if w := metricstest.Bool(other == st); got[k].Value != w {
				t.Errorf("in state %v: %s = %v, want %v", st, k, got[k].Value, w)
			}
		}
		if v := got[`cuckooguard_fanout_current_as_of_timestamp_seconds{table="users"}`].Value; v != 0 {
			t.Errorf("current_as_of of a follower never confirmed = %v, want 0", v)
		}
	}
}

func TestNilPanics(t *testing.T) {
	for name, mk := range map[string]func(){
		"follower":     func() { fanoutmetrics.NewFollowerCollector(nil) },
		"nil follower": func() { fanoutmetrics.NewFollowerCollector((*fanout.Follower[int64])(nil)) },
		"relay":        func() { fanoutmetrics.NewRelayCollector(nil) },
		"nil relay":    func() { fanoutmetrics.NewRelayCollector((*fanout.Relay)(nil)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			mk()
		}()
	}
}
