package mysql

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
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

// TestMeasureResume measures, with CUCKOOGUARD_MEASURE=1, on a table of
// 500,000 keys: how long the first read takes to follow, how long a
// session takes to follow again after its stream is killed (a resume),
// and how long a new process with the snapshot file takes to follow (a
// restore and a resume), against a read of the table.
func TestMeasureResume(t *testing.T) {
	if os.Getenv("CUCKOOGUARD_MEASURE") != "1" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure")
	}
	srv := testDSN(t)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	const rows = 500_000
	for lo := 0; lo < rows; lo += 50_000 {
		insertRange(t, c, table, lo, lo+50_000)
	}
	file := filepath.Join(t.TempDir(), "users.guard")
	start := time.Now()
	a := startNode(t, srv, table, "id", parseInt64, WithSnapshotFile(file))
	read := a.waitCurrent(t)
	killed := time.Now()
	resumed := a.follower.Stats().Resumes
	killStreams(t, c)
	resume := a.waitResume(t, resumed, killed)
	a.halt(t)
	info, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	b := startNode(t, srv, table, "id", parseInt64, WithSnapshotFile(file))
	restore := b.waitCurrent(t)
	sa, sb := a.follower.Stats(), b.follower.Stats()
	checked, wrong := b.wrong404s(t, parseInt64)
	t.Logf("%d keys: the first start (a read) followed after %v; after a killed stream, following again after %v (%d reads, %d resumes); a new process with the %d-byte snapshot file followed after %v (%d reads, %d restores, %d resumes); %d keys checked, %d wrong 404s; whole test %v",
		rows, read.Round(time.Millisecond), resume.Round(time.Millisecond), sa.FullReads, sa.Resumes, info.Size(), restore.Round(time.Millisecond),
		sb.FullReads, sb.Restores, sb.Resumes, checked, wrong, time.Since(start).Round(time.Millisecond))
	if wrong != 0 || sb.FullReads != 0 {
		t.Fatalf("%d wrong 404s, %d reads by the restarted process; want 0, 0", wrong, sb.FullReads)
	}
}

// TestMeasureWriteTax measures, with CUCKOOGUARD_MEASURE=1, what binlog
// followers cost the server's writers: the statements per second that 8
// writers commit on a table (inserts of two rows, deletes and key updates,
// as the fault tests write) with no follower, with 1 and with 8 following
// it, alternated in rounds (CUCKOOGUARD_ROUNDS, 2 by default) of 5 s each.
// Each follower is a binlog reader of the whole server (a dump thread)
// and a Follower in this process, with its heartbeat; the server, the
// writers and the followers share this machine's cores, as the test
// says when it logs.
func TestMeasureWriteTax(t *testing.T) {
	if os.Getenv("CUCKOOGUARD_MEASURE") != "1" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure")
	}
	srv := testDSN(t)
	table, _ := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	const d = 5 * time.Second
	rounds := 2
	if n, err := strconv.Atoi(os.Getenv("CUCKOOGUARD_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	phase := func(followers int) float64 {
		var nodes []*node[int64]
		for range followers {
			nodes = append(nodes, startNode(t, srv, table, "id", parseInt64))
		}
		for _, n := range nodes {
			n.waitCurrent(t)
		}
		w := startWriters(t, srv, table, 8, 1<<20)
		time.Sleep(d)
		w.halt()
		for _, n := range nodes {
			n.waitCurrent(t) // it kept up: every commit applied
			n.halt(t)
		}
		return float64(w.commits.Load()) / d.Seconds()
	}
	rates := map[int][]float64{}
	for range rounds {
		for _, f := range []int{0, 1, 0, 8} {
			rates[f] = append(rates[f], phase(f))
		}
	}
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	none := mean(rates[0])
	t.Logf("8 writers, %d cores (GOMAXPROCS %d), statements/s per %v run: no follower %.0f, 1 follower %.0f (%.2fx), 8 followers %.0f (%.2fx)",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), d, rates[0], rates[1], mean(rates[1])/none, rates[8], mean(rates[8])/none)
}
