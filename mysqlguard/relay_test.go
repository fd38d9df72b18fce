package mysqlguard

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/fanout"
)

// newRelayEnv is newEnv with a NATS connection: the replicas it starts
// follow the tables through one relay. It skips without
// CUCKOOGUARD_NATS_URL, and fails without it under CI=true.
func newRelayEnv(t *testing.T) *env {
	t.Helper()
	url := os.Getenv("CUCKOOGUARD_NATS_URL")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and CUCKOOGUARD_NATS_URL is unset: .ci/run starts nats-server and sets it")
		}
		t.Skip("set CUCKOOGUARD_NATS_URL (and CUCKOOGUARD_MYSQL_DSN) to run through a relay (.ci/run starts both)")
	}
	e := newEnv(t)
	// The relay needs it; the test's server may have been restarted
	// without it.
	if _, err := e.db.ExecContext(context.Background(), "SET GLOBAL binlog_row_metadata = 'FULL'"); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.nc = nc // closed by newEnv's cleanup, after its Teardown
	return e
}

// TestFleetThroughRelay runs a service of two tables on two replicas
// through one relay while another client writes: /readyz is 503 at the
// start and 200 once both follow; orders and customers (mixed case)
// inserted through replica a, and orders deleted through it, are read on
// b under their tokens, which b's relayed followers reach (none passes
// through as of another stream, none after waiting); every committed key
// reads present on both; a's
// followers skip its own inserts; exactly one relay leads and the
// collector gathers pedantically; a third replica started later is ready
// from the saved guards without reading either table; Close leaves no
// goroutine; and Teardown removes the relay's place, its subjects and the
// saved guards.
func TestFleetThroughRelay(t *testing.T) {
	e := newRelayEnv(t)
	ctx := context.Background()
	before := goleak.IgnoreCurrent()
	subsBefore := e.nc.NumSubscriptions()

	a := e.start(t, "a", "")
	if got := readyz(t, a.svc); !strings.HasPrefix(got, "503") || !strings.Contains(got, e.orders+": ") || !strings.Contains(got, e.customers+": ") {
		t.Fatalf("/readyz right after Start = %q, want 503 naming both tables", got)
	} else {
		t.Logf("/readyz right after Start: %q", got)
	}
	b := e.start(t, "b", "")

	halt := e.startOtherWriter(t, ctx)
	waitReady(t, a, b)
	waitReadyz(t, a, b)

	// Writes through replica a, read at once on replica b under their
	// tokens.
	const n = 200
	bBefore := b.orders.Loader().Stats()
	behind, tok := e.writeThrough(t, ctx, a, b, n)
	bAfter := b.orders.Loader().Stats()
	lookups, foreign := bAfter.TokenLookups-bBefore.TokenLookups, bAfter.TokenForeign-bBefore.TokenForeign
	t.Logf("%d orders and %d customers inserted through a, read on b under their tokens: %d would have read absent on b without the token; of b's %d token lookups of orders %d waited, %d passed through after the wait, %d passed through at once as of another stream (last token %v; b's position %v)",
		n, n, behind, lookups, bAfter.TokenWaits-bBefore.TokenWaits, bAfter.TokenPassed-bBefore.TokenPassed, foreign, tok, b.orders.Loader().Position())
	// The token's stream is the relayed follower's (the relay carries the
	// GTID sequence numbers writers' tokens name): the guard answers, and
	// no lookup may wait out the 10 s.
	if foreign != 0 {
		t.Errorf("%d of %d token lookups on b were of another stream than b's relayed follower reaches", foreign, lookups)
	}
	if p := bAfter.TokenPassed - bBefore.TokenPassed; p != 0 {
		t.Errorf("%d lookups under a token passed through after waiting 10 s", p)
	}
	if lookups < n {
		t.Errorf("%d token lookups of orders counted on b, want %d", lookups, n)
	}
	halt()

	checked := e.checkKeys(t, a, b)
	t.Logf("%d lookups of committed keys on 2 replicas through the relay, 0 may read absent", checked)
	for _, c := range []struct {
		name string
		st   fanout.Stats
	}{{e.orders, a.orders.rf.Stats()}, {e.customers, a.customers.rf.Stats()}} {
		// The customers went in mixed case; the Loader holds them in the
		// column's one text, and so does their tag: skipped, not a second
		// copy.
		if c.st.Skipped < n {
			t.Errorf("a's follower of %s skipped %d of its own %d inserts: %+v", c.name, c.st.Skipped, n, c.st)
		}
		t.Logf("a's follower of %s: skipped %d (own inserts, tagged), applied %d, reads %v", c.name, c.st.Skipped, c.st.Applied, c.st.Reads)
	}

	// One relay leads; each replica's collector gathers, pedantically.
	var leading float64
	for i, r := range []*replica{a, b} {
		reg := prometheus.NewPedanticRegistry()
		if err := reg.Register(r.svc); err != nil {
			t.Fatal(err)
		}
		if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
			t.Errorf("replica %d: lint: %v %v", i, problems, err)
		}
		leading += sample(t, reg, "cuckooguard_fanout_relay_leading{}")
		for table, st := range map[string]fanout.Stats{e.orders: r.orders.rf.Stats(), e.customers: r.customers.rf.Stats()} {
			// Read once, or started from a's saved guard: b may start after
			// a saved one.
			if starts := sum(st.Reads) + st.SnapshotStarts; starts != 1 {
				t.Errorf("replica %d, %s: reads %v and %d starts from a saved guard, want one start", i, table, st.Reads, st.SnapshotStarts)
			}
			for name, want := range map[string]float64{
				`cuckooguard_fanout_full_reads_total{reason="start",table="` + table + `"}`: float64(st.Reads["start"]),
				`cuckooguard_fanout_snapshot_starts_total{table="` + table + `"}`:           float64(st.SnapshotStarts),
				`cuckooguard_fanout_nats_connected{table="` + table + `"}`:                  1,
				`cuckooguard_follower_state{state="following",table="` + table + `"}`:       1,
				`cuckooguard_loader_ready{table="` + table + `"}`:                           1,
			} {
				if got := sample(t, reg, name); got != want {
					t.Errorf("replica %d: %s = %v, want %v", i, name, got, want)
				}
			}
		}
	}
	if leading != 1 {
		t.Errorf("%v relays lead, want 1", leading)
	}

	// A third replica, started later, starts from the guards the leading
	// replica saved: ready without reading either table.
	waitSaved(t, a, b)
	c := e.start(t, "c", "")
	checked = e.checkKeys(t, a, b, c)
	t.Logf("a third replica started later: %d lookups of committed keys on 3 replicas, 0 may read absent", checked)
	for name, st := range map[string]fanout.Stats{e.orders: c.orders.rf.Stats(), e.customers: c.customers.rf.Stats()} {
		reads := sum(st.Reads)
		t.Logf("replica c, %s: %d reads of the table (%v), %d starts from a saved guard", name, reads, st.Reads, st.SnapshotStarts)
		if reads != 0 || st.SnapshotStarts != 1 {
			t.Errorf("replica c, %s: %d reads of the table (%v), %d starts from a saved guard; want 0 and 1", name, reads, st.Reads, st.SnapshotStarts)
		}
	}

	// Close leaves no goroutine of the services'.
	for _, r := range []*replica{a, b, c} {
		if err := r.svc.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// What may stay on the test's connection: nats.go's request mux, one
	// for the connection's life, and at most one subscription per relay
	// that led (a, b and c), its JetStream publisher's reply inbox with its
	// goroutine, which fanout.Relay.Run leaves behind (it does not call
	// CleanupPublisher; fanout's, not this package's). Six followers'
	// subscriptions left behind would not pass.
	if left := e.nc.NumSubscriptions(); left > subsBefore+1+3 {
		t.Errorf("%d subscriptions left on the NATS connection after Close (%d before Start), want at most %d", left, subsBefore, subsBefore+4)
	} else {
		t.Logf("%d subscriptions left on the NATS connection after Close (%d before Start)", left, subsBefore)
	}
	goleak.VerifyNone(t, before, natsPutLeak,
		goleak.IgnoreAnyFunction("github.com/nats-io/nats%2ego.(*Conn).waitForMsgs"),               // the subscriptions counted above
		goleak.IgnoreTopFunction("github.com/go-mysql-org/go-mysql/driver.connInfo.Connect.func3")) // a connection of the test's pool, e.db

	// Teardown removes the relay's place, its subjects and its saved
	// guards; each is there before it.
	counts := func() (places, subjects, objects int) {
		e.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM cuckooguard_relay WHERE name = ?", e.service).Scan(&places)
		js, err := jetstream.New(e.nc)
		if err != nil {
			t.Fatal(err)
		}
		if s, err := js.Stream(ctx, fanout.DefaultStream); err == nil {
			si, _ := s.Info(ctx, jetstream.WithSubjectFilter(fanout.DefaultSubjectPrefix+".*."+fanout.Token(e.service)+".>"))
			if si != nil {
				subjects = len(si.State.Subjects)
			}
		}
		if obs, err := js.ObjectStore(ctx, fanout.DefaultBucket); err == nil {
			infos, _ := obs.List(ctx)
			for _, info := range infos {
				if strings.Contains(info.Name, "."+fanout.Token(e.service)+".") {
					objects++
				}
			}
		}
		return places, subjects, objects
	}
	places, subjects, objects := counts()
	t.Logf("before Teardown: %d relay places, %d subjects, %d saved guards of the service", places, subjects, objects)
	if places != 1 || subjects == 0 || objects != 2 {
		t.Errorf("before Teardown: %d relay places, %d subjects, %d saved guards; want 1, some, 2", places, subjects, objects)
	}
	if err := Teardown(ctx, e.db, Config{DSN: e.dsn, Service: e.service, NATS: e.nc}, e.orders, e.customers); err != nil {
		t.Fatal(err)
	}
	places, subjects, objects = counts()
	t.Logf("after Teardown: %d relay places, %d subjects, %d saved guards of the service", places, subjects, objects)
	if places+subjects+objects != 0 {
		t.Errorf("Teardown left %d relay places, %d subjects, %d saved guards", places, subjects, objects)
	}
}

// waitSaved waits until one of the replicas has saved the guards of both
// tables since the last write.
func waitSaved(t *testing.T, rs ...*replica) {
	t.Helper()
	saved := func() (orders, customers int64) {
		for _, r := range rs {
			orders += r.orders.rf.Stats().SnapshotsSaved
			customers += r.customers.rf.Stats().SnapshotsSaved
		}
		return orders, customers
	}
	o0, c0 := saved()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if o, c := saved(); o > o0 && c > c0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no guard saved within 30 s")
		}
	}
}

func sum(m map[string]int64) (n int64) {
	for _, v := range m {
		n += v
	}
	return n
}
