package mysql

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestMeasureLag measures, with CUCKOOGUARD_MEASURE=1, how long a row
// committed by another connection takes to read present in a following
// Loader (commit to applied), while two writers commit in the background,
// and the heartbeats' round trips.
func TestMeasureLag(t *testing.T) {
	if os.Getenv("CUCKOOGUARD_MEASURE") != "1" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure")
	}
	srv := testDSN(t)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	w := startWriters(t, srv, table, 2, 1_000_000)
	n := startNode(t, srv, table, "id", parseInt64)
	n.waitCurrent(t)
	var lags, rtts []time.Duration
	last := n.follower.Stats().CurrentAsOf
	start := time.Now()
	for i := range int64(2000) {
		id := 10_000_000 + i
		exec(t, c, fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, id))
		committed := time.Now()
		for !(n.loader.Ready() && n.loader.MayContain(id)) {
			runtime.Gosched()
			if time.Since(committed) > 10*time.Second {
				t.Fatalf("%d did not read present in 10 s", id)
			}
		}
		lags = append(lags, time.Since(committed))
		if st := n.follower.Stats(); st.CurrentAsOf != last {
			last = st.CurrentAsOf
			rtts = append(rtts, st.Lag)
		}
	}
	elapsed := time.Since(start)
	w.halt()
	q := func(d []time.Duration, p float64) time.Duration {
		slices.Sort(d)
		return d[int(float64(len(d)-1)*p)].Round(10 * time.Microsecond)
	}
	t.Logf("commit to present: p50 %v, p99 %v, max %v over %d rows; heartbeat round trip: p50 %v, p99 %v over %d; %d background commits in %v",
		q(lags, 0.5), q(lags, 0.99), q(lags, 1), len(lags), q(rtts, 0.5), q(rtts, 0.99), len(rtts), w.commits.Load(), elapsed.Round(time.Millisecond))
}
