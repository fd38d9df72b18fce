package pgmetrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/internal/metricstest"
	"github.com/cuckooguard/cuckooguard/metrics/pgmetrics"
	"github.com/cuckooguard/cuckooguard/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A *postgres.Follower is what the collector watches.
var _ pgmetrics.FollowerStatser = (*postgres.Follower[int64])(nil)

// fixed is a follower whose statistics the test sets.
type fixed struct{ st postgres.FollowerStats }

func (f *fixed) Stats() postgres.FollowerStats { return f.st }

func TestFollowerCollector(t *testing.T) {
	beat := time.Unix(1_700_000_000, 250_000_000)
	f := &fixed{postgres.FollowerStats{
		State: postgres.Behind, Applied: 101, Skipped: 7, Resyncs: 3, Failures: 3,
		Lag: 1500 * time.Millisecond, Heartbeats: 60, HeartbeatsLost: 1, RetryDelay: 250 * time.Millisecond,
		FailuresByReason: map[postgres.Reason]int64{postgres.ReasonConnectionLost: 2, postgres.ReasonHeartbeatLost: 1},
		LastErrorReason:  postgres.ReasonHeartbeatLost,
		FullReads:        map[postgres.ReadReason]int64{postgres.ReadStart: 1, postgres.ReadSlotLost: 2},
		SlotRetained:     1 << 20, Snapshots: 4, SnapshotStart: 1,
		DecodingBehind: 3 << 20, BusyWaits: 2,
		LastHeartbeat: beat, // LastApplied zero: never
	}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(pgmetrics.NewFollowerCollector(f, metrics.WithConstLabels(prometheus.Labels{"table": "users"})))
	gauge := func(v float64) metricstest.Sample { return metricstest.Sample{Type: metricstest.Gauge, Value: v} }
	counter := func(v float64) metricstest.Sample { return metricstest.Sample{Type: metricstest.Counter, Value: v} }
	want := map[string]metricstest.Sample{
		`cuckooguard_follower_state{state="pass-through",table="users"}`:           gauge(0),
		`cuckooguard_follower_state{state="resyncing",table="users"}`:              gauge(0),
		`cuckooguard_follower_state{state="following",table="users"}`:              gauge(0),
		`cuckooguard_follower_state{state="behind",table="users"}`:                 gauge(1),
		`cuckooguard_follower_lag_seconds{table="users"}`:                          gauge(1.5),
		`cuckooguard_follower_notifications_total{result="applied",table="users"}`: counter(101),
		`cuckooguard_follower_notifications_total{result="skipped",table="users"}`: counter(7),
		`cuckooguard_follower_resyncs_total{table="users"}`:                        counter(3),
		`cuckooguard_follower_retry_delay_seconds{table="users"}`:                  gauge(0.25),
		`cuckooguard_follower_heartbeats_total{table="users"}`:                     counter(60),
		`cuckooguard_follower_heartbeats_lost_total{table="users"}`:                counter(1),
		`cuckooguard_follower_last_heartbeat_timestamp_seconds{table="users"}`:     gauge(1_700_000_000.25),
		`cuckooguard_follower_last_applied_timestamp_seconds{table="users"}`:       gauge(0),
		`cuckooguard_follower_decoding_behind_bytes{table="users"}`:                gauge(3 << 20),
		`cuckooguard_follower_busy_waits_total{table="users"}`:                     counter(2),
	}
	for _, r := range postgres.ReadReasons {
		want[`cuckooguard_follower_full_reads_total{reason="`+string(r)+`",table="users"}`] = counter(float64(f.st.FullReads[r]))
	}
	want[`cuckooguard_follower_slot_retained_bytes{table="users"}`] = gauge(1 << 20)
	want[`cuckooguard_follower_snapshots_total{table="users"}`] = counter(4)
	want[`cuckooguard_follower_snapshot_starts_total{table="users"}`] = counter(1)
	for _, r := range postgres.Reasons {
		want[`cuckooguard_follower_session_failures_total{reason="`+string(r)+`",table="users"}`] = counter(float64(f.st.FailuresByReason[r]))
	}
	metricstest.Compare(t, metricstest.Gather(t, reg), want)
	metricstest.Lint(t, reg)

	// The state gauge follows the follower's state, one scrape at a time.
	for _, st := range pgmetrics.States {
		f.st.State = st
		got := metricstest.Gather(t, reg)
		for _, other := range pgmetrics.States {
			k := `cuckooguard_follower_state{state="` + other.String() + `",table="users"}`
			if w := metricstest.Bool(other == st); got[k].Value != w {
				t.Errorf("in state %v: %s = %v, want %v", st, k, got[k].Value, w)
			}
		}
	}
}
