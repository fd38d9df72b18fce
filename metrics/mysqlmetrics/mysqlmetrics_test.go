package mysqlmetrics_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/internal/metricstest"
	"github.com/cuckooguard/cuckooguard/metrics/mysqlmetrics"
	"github.com/cuckooguard/cuckooguard/mysql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A *mysql.Follower is what the collector watches.
var _ mysqlmetrics.FollowerStatser = (*mysql.Follower[int64])(nil)

// fixed is a follower whose statistics the test sets.
type fixed struct{ st mysql.Stats }

func (f *fixed) Stats() mysql.Stats { return f.st }

func TestFollowerCollector(t *testing.T) {
	asOf := time.Unix(1_700_000_000, 250_000_000)
	f := &fixed{mysql.Stats{
		State: mysql.Behind, Lag: 1500 * time.Millisecond, CurrentAsOf: asOf,
		Applied: 101, Skipped: 7, Heartbeats: 60, FullReads: 1, ReadReason: "the first session",
		Resumes: 2, Restores: 0, Snapshots: 4, Failures: 3, LastError: errors.New("lost"), ServerID: 3_000_000_001,
	}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(mysqlmetrics.NewFollowerCollector(f, metrics.WithConstLabels(prometheus.Labels{"table": "users"})))
	gauge := func(v float64) metricstest.Sample { return metricstest.Sample{Type: metricstest.Gauge, Value: v} }
	counter := func(v float64) metricstest.Sample { return metricstest.Sample{Type: metricstest.Counter, Value: v} }
	want := map[string]metricstest.Sample{
		`cuckooguard_follower_state{state="pass-through",table="users"}`:                 gauge(0),
		`cuckooguard_follower_state{state="resyncing",table="users"}`:                    gauge(0),
		`cuckooguard_follower_state{state="following",table="users"}`:                    gauge(0),
		`cuckooguard_follower_state{state="behind",table="users"}`:                       gauge(1),
		`cuckooguard_follower_lag_seconds{table="users"}`:                                gauge(1.5),
		`cuckooguard_follower_current_as_of_timestamp_seconds{table="users"}`:            gauge(1_700_000_000.25),
		`cuckooguard_follower_notifications_total{result="applied",table="users"}`:       counter(101),
		`cuckooguard_follower_notifications_total{result="skipped",table="users"}`:       counter(7),
		`cuckooguard_follower_full_reads_total{reason="start",table="users"}`:            counter(1),
		`cuckooguard_follower_full_reads_total{reason="snapshot_missing",table="users"}`: counter(0),
		`cuckooguard_follower_full_reads_total{reason="snapshot_bad",table="users"}`:     counter(0),
		`cuckooguard_follower_full_reads_total{reason="other",table="users"}`:            counter(0),
		`cuckooguard_follower_session_failures_total{table="users"}`:                     counter(3),
		`cuckooguard_follower_heartbeats_total{table="users"}`:                           counter(60),
		`cuckooguard_follower_snapshots_total{table="users"}`:                            counter(4),
		`cuckooguard_follower_snapshot_starts_total{table="users"}`:                      counter(0),
		`cuckooguard_mysql_resumes_total{table="users"}`:                                 counter(2),
		`cuckooguard_mysql_server_id{table="users"}`:                                     gauge(3_000_000_001),
	}
	metricstest.Compare(t, metricstest.Gather(t, reg), want)
	metricstest.Lint(t, reg)

	// Reads the scrapes find are counted under the reason of the last one
	// each scrape sees; the counters never go back.
	for _, step := range []struct {
		reads  int64
		reason string
		want   map[string]float64
	}{
		{1, "the first session", map[string]float64{"start": 1}},
		{2, "a DDL statement names the table", map[string]float64{"start": 1, "other": 1}},
		{4, "snapshot file: the file is of column id of db.other", map[string]float64{"start": 1, "other": 1, "snapshot_bad": 2}},
		{5, "snapshot file: open /x/users.guard: no such file or directory", map[string]float64{"start": 1, "other": 1, "snapshot_bad": 2, "snapshot_missing": 1}},
		{5, "the first session", map[string]float64{"start": 1, "other": 1, "snapshot_bad": 2, "snapshot_missing": 1}},
	} {
		f.st.FullReads, f.st.ReadReason = step.reads, step.reason
		got := metricstest.Gather(t, reg)
		for _, r := range mysqlmetrics.Reasons {
			k := `cuckooguard_follower_full_reads_total{reason="` + r + `",table="users"}`
			if got[k].Value != step.want[r] {
				t.Errorf("after %d reads (last: %q): %s = %v, want %v", step.reads, step.reason, k, got[k].Value, step.want[r])
			}
		}
	}

	// The state gauge follows the follower's state, one scrape at a time.
	for _, st := range mysqlmetrics.States {
		f.st.State = st
		got := metricstest.Gather(t, reg)
		for _, other := range mysqlmetrics.States {
			k := `cuckooguard_follower_state{state="` + other.String() + `",table="users"}`
			if w := metricstest.Bool(other == st); got[k].Value != w {
				t.Errorf("in state %v: %s = %v, want %v", st, k, got[k].Value, w)
			}
		}
	}
}

func TestNilFollowerPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewFollowerCollector(nil) did not panic")
		}
	}()
	var f *mysql.Follower[int64]
	mysqlmetrics.NewFollowerCollector(f)
}
