package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// The first week in production: a bulk load took every replica out of
// rotation for good. A walsender decoding a big transaction sends nothing
// until it is done; the follower called its connection dead after the
// heartbeat deadline, reconnected, and the new session decoded the same
// WAL from the same point, in a loop. These tests load while two
// replicas follow, and check that each waits for its walsender, behind,
// and follows again once the load has been decoded: no failed session,
// no "slot in use", no wrong 404, and the slots confirm past the load.

// bulkLoad is one load of the bulk-load tests: rows rows of about 100
// bytes each into table, in one transaction.
type bulkLoad struct {
	table string
	rows  int
}

// runBulkLoads starts two replicas of users with opts, and commits each
// load in turn while they follow. For each it reports how long the
// server took to decode it (until both walsenders had read past its
// commit) and how long until each replica followed with every change
// committed before it, and checks every key.
func runBulkLoads(t *testing.T, loads []bulkLoad, opts ...Option) {
	ctx := context.Background()
	dsn := setupUsers(t, 1000)
	execAll(t, dsn, `CREATE TABLE junk (id bigint, pad text)`)
	conf := nodeConf{opts: opts, heartbeat: hbOf(opts)}
	nodes := []*node[int64]{
		startNode(t, dsn, "users", "id", "A", parseInt64, conf),
		startNode(t, dsn, "users", "id", "B", parseInt64, conf),
	}
	c := connect(t, dsn)
	next := 1_000_000
	for _, load := range loads {
		q := fmt.Sprintf(`INSERT INTO %s SELECT g, repeat('x', 100) FROM generate_series(%d, %d) g`, load.table, next, next+load.rows-1)
		if load.table == "users" {
			q = fmt.Sprintf(`INSERT INTO users SELECT g, repeat('x', 100) FROM generate_series(%d, %d) g`, next, next+load.rows-1)
		}
		next += load.rows
		start := time.Now()
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
		var commitText string
		if err := c.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&commitText); err != nil {
			t.Fatal(err)
		}
		commit, _ := pglogrepl.ParseLSN(commitText)
		committed := time.Since(start)
		after := time.Now() // every node must follow with the load: a heartbeat sent after this back
		var wg sync.WaitGroup
		decoded := make([]time.Duration, len(nodes))
		following := make([]time.Duration, len(nodes))
		for i, n := range nodes {
			wg.Go(func() {
				decoded[i] = waitDecoded(ctx, dsn, n, commit, start)
				for {
					st := n.follower.Stats()
					if st.State == Following && n.loader.Ready() && st.CurrentAsOf.After(after) {
						following[i] = time.Since(start)
						return
					}
					if time.Since(start) > 10*time.Minute {
						t.Errorf("%s never followed with the load: %v, %v", n.id, st.State, st.LastError)
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		for i, n := range nodes {
			st := n.follower.Stats()
			t.Logf("%d rows into %s (committed in %v): replica %s: decoded %v after the commit began, following with it %v after; %d waits for a busy walsender, failures %v",
				load.rows, load.table, committed.Round(time.Millisecond), n.id, decoded[i].Round(time.Millisecond), following[i].Round(time.Millisecond), st.BusyWaits, st.FailuresByReason)
		}
	}
	for _, n := range nodes {
		if st := n.follower.Stats(); st.Failures != 0 || st.Resyncs != 1 {
			t.Errorf("replica %s: %d failed sessions %v (last: %v), %d full reads: want none beyond the first read", n.id, st.Failures, st.FailuresByReason, st.LastError, st.Resyncs)
		}
		expectNoWrong404s(t, n, "replica "+n.id+" after the loads")
	}
	// Nothing pinned: each slot has confirmed past the last load.
	var end string
	if err := c.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	last, _ := pglogrepl.ParseLSN(end)
	for _, n := range nodes {
		schema, rel, err := splitTable(ctx, c, "users")
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			st, err := readSlot(ctx, c, slotName(schema, rel, n.id))
			if err != nil {
				t.Fatal(err)
			}
			if st.confirmed >= last {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("slot of %s confirmed %s, not past the loads' end %s: it pins %d bytes of WAL", n.id, st.confirmed, last, st.retained)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// waitDecoded waits until n's walsender has read the WAL past commit, and
// returns how long after start that was (0 if it cannot tell).
func waitDecoded(ctx context.Context, dsn string, n *node[int64], commit pglogrepl.LSN, start time.Time) time.Duration {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0
	}
	defer c.Close(ctx)
	for time.Since(start) < 10*time.Minute {
		var sent *string
		pid := n.follower.Stats().BackendPID // the session's, whichever it is
		err := c.QueryRow(ctx, `SELECT sent_lsn::text FROM pg_stat_replication WHERE pid = $1`, int64(pid)).Scan(&sent)
		if err == nil && sent != nil {
			if lsn, _ := pglogrepl.ParseLSN(*sent); lsn >= commit {
				return time.Since(start)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0
}

// hbOf returns the heartbeat that opts set, or the default.
func hbOf(opts []Option) time.Duration {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.heartbeat == 0 {
		return DefaultHeartbeat
	}
	return c.heartbeat
}

// TestBulkLoad is the CI size: loads whose decoding takes longer than the
// heartbeat deadline of 150 ms (heartbeat 50 ms) on a small machine.
func TestBulkLoad(t *testing.T) {
	runBulkLoads(t, []bulkLoad{{"junk", 300_000}, {"users", 100_000}}, WithHeartbeat(hb))
}

// TestBulkLoadMeasured is the issue's: 3M rows into a table nobody
// follows, and 600k into the followed one, with the default options.
//
//	CUCKOOGUARD_MEASURE=1 go test -run TestBulkLoadMeasured -v -timeout 30m .
func TestBulkLoadMeasured(t *testing.T) {
	measuring(t)
	runBulkLoads(t, []bulkLoad{{"junk", 3_000_000}, {"users", 600_000}})
}
