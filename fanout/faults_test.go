package fanout

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// load is another process that commits a row of users every millisecond,
// and checkers that read committed rows through the followers: a 404 for
// a row committed longer ago than bound, and still in the table that
// users names (a rename, a DROP or a restore of the database can take a
// row out of it), is a wrong 404.
type load struct {
	t       *testing.T
	bound   time.Duration
	mu      sync.Mutex
	ids     []int64
	at      []time.Time
	gets    atomic.Int64
	wrong   atomic.Int64
	passing atomic.Int64 // Gets while the follower passed through
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

func startLoad(t *testing.T, e *env, nodes []*node, bound time.Duration) *load {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{t: t, bound: bound, stop: cancel}
	l.wg.Go(func() {
		var c *pgx.Conn
		for id := int64(10_000_000); ctx.Err() == nil; id++ {
			if c == nil || c.IsClosed() {
				var err error
				if c, err = pgx.Connect(ctx, e.dsn); err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
			}
			if _, err := c.Exec(ctx, `INSERT INTO users VALUES ($1, 'w')`, id); err != nil {
				continue
			}
			l.mu.Lock()
			l.ids, l.at = append(l.ids, id), append(l.at, time.Now())
			l.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
		if c != nil {
			c.Close(context.Background())
		}
	})
	for i, n := range nodes {
		l.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			for k := 0; ctx.Err() == nil; k++ {
				l.mu.Lock()
				// Every other lookup is of one of the 50 newest rows; the
				// others of one of the 50 newest committed more than the
				// bound ago, the rows a wrong 404 is counted for even while
				// the writer keeps up.
				last := len(l.ids)
				if k%2 == 1 {
					cutoff := time.Now().Add(-l.bound)
					last = sort.Search(len(l.at), func(i int) bool { return l.at[i].After(cutoff) })
				}
				if last == 0 {
					l.mu.Unlock()
					time.Sleep(time.Millisecond)
					continue
				}
				j := last - 1 - rng.IntN(min(last, 50))
				id, at := l.ids[j], l.at[j]
				l.mu.Unlock()
				begin := time.Now()
				if !n.loader.Ready() {
					l.passing.Add(1)
				}
				_, err := n.loader.Get(ctx, id)
				l.gets.Add(1)
				if errors.Is(err, guarded.ErrNotFound) && begin.Sub(at) > l.bound && l.exists(ctx, n, id) {
					l.wrong.Add(1)
					t.Errorf("%s: Get(%d) = ErrNotFound %v after its commit (bound %v): %+v", n.id, id, begin.Sub(at), l.bound, n.f.Stats())
				}
				time.Sleep(200 * time.Microsecond)
			}
		})
	}
	t.Cleanup(l.halt)
	return l
}

// exists reports whether users, the table the name names now, holds the
// row of id: a row that a rename swap, a DROP or a restore of the database
// took out of it reads absent rightly.
func (l *load) exists(ctx context.Context, n *node, id int64) bool {
	var found bool
	if err := n.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM users WHERE id = $1)`, id).Scan(&found); err != nil {
		return false // no table of the name (dropped), or no database: the 404 may be right
	}
	return found
}

func (l *load) halt() {
	l.stop()
	l.wg.Wait()
}

// TestRelayFailover kills the relay five times during steady writes:
// another replica's relay takes over within the heartbeat deadline, and
// no follower answers 404 for a committed row.
func TestRelayFailover(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 1000)
	name := "r_failover"
	relays := make([]*Relay, 2)
	stops := make([]func(), 2)
	for i := range relays {
		relays[i], stops[i] = e.startRelay(t, name, "users")
	}
	nodes := []*node{e.startNode(t, "a", "users"), e.startNode(t, "b", "users")}
	l := startLoad(t, e, nodes, 600*time.Millisecond)
	// How long the followers pass through, sampled every millisecond.
	var passed [2]atomic.Int64
	sctx, stopSampling := context.WithCancel(context.Background())
	var sampling sync.WaitGroup
	for i, n := range nodes {
		sampling.Go(func() {
			for t := time.NewTicker(time.Millisecond); sctx.Err() == nil; <-t.C {
				if !n.loader.Ready() {
					passed[i].Add(int64(time.Millisecond))
				}
			}
		})
	}
	var took []time.Duration
	for round := range 5 {
		time.Sleep(300 * time.Millisecond)
		// A relay leads, or will within the deadline: on a loaded machine
		// the last round's winner may have let its lease lapse since
		// (RelayStats.Lapsed), and the other campaigns every heartbeat.
		for deadline := time.Now().Add(10 * time.Second); !relays[0].Leading() && !relays[1].Leading(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no relay leads within 10 s: %+v, %+v", round, relays[0].Stats(), relays[1].Stats())
			}
		}
		// Kill the relay's session: its lock's connection and its stream's.
		killed := time.Now()
		e.killRelaySessions(t, name)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if st := relays[0].Stats().Source.Commits + relays[1].Stats().Source.Commits; (relays[0].Leading() || relays[1].Leading()) && time.Since(killed) > 10*time.Millisecond && st > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no relay took over within 10 s", round)
			}
		}
		for _, n := range nodes {
			n.waitCurrent(t)
		}
		took = append(took, time.Since(killed).Round(time.Millisecond))
	}
	l.halt()
	stopSampling()
	sampling.Wait()
	t.Logf("5 relay kills: followers current again %v after each; they passed lookups through for %v and %v in all; %d Gets, %d while passing through, %d wrong 404s",
		took, time.Duration(passed[0].Load()), time.Duration(passed[1].Load()), l.gets.Load(), l.passing.Load(), l.wrong.Load())
	for _, n := range nodes {
		expectNoWrong404s(t, n, "after the failovers")
	}
}

// TestBrokerFaults: a stream purged of messages a follower had not read
// yet is a gap, which the follower meets by reading the table; a deleted
// consumer is made again; a restarted nats-server
// (CUCKOOGUARD_NATS_RESTART, a command that restarts the test's server)
// is waited out. None gives a wrong 404.
func TestBrokerFaults(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.table(t, "users", 1000)
	e.startRelay(t, "r_faults", "users")
	// a reaches NATS through a proxy that can stop forwarding.
	p, nc := natsViaProxy(t)
	a := e.startNodeOn(t, nc, "a", "users")
	l := startLoad(t, e, []*node{a}, 600*time.Millisecond)
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "CG_"+e.id)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)

	// Purge while a cannot read: what the server sent it is lost with
	// its connection, and the rows committed meanwhile are in no stream
	// any more.
	p.Stall()
	time.Sleep(300 * time.Millisecond)
	if err := stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	p.CloseConns()
	p.Resume()
	a.waitCurrent(t)
	if st := a.f.Stats(); st.Reads[readGap] == 0 {
		t.Errorf("no read of the table after the stream lost messages a had not read: %+v", st)
	}
	expectNoWrong404s(t, a, "after the purge")

	// Delete the follower's consumer: it is made again, from where the
	// follower stands.
	names := stream.ConsumerNames(ctx)
	for name := range names.Name() {
		if err := stream.DeleteConsumer(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	a.waitCurrent(t)
	t.Logf("consumer deleted: %+v", a.f.Stats())

	if cmd := os.Getenv("CUCKOOGUARD_NATS_RESTART"); cmd != "" {
		restart := time.Now()
		if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		up := time.Now()
		a.waitCurrent(t)
		t.Logf("nats-server restart: down and up in %v; following again %v after it was up", up.Sub(restart).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
	} else {
		t.Log("CUCKOOGUARD_NATS_RESTART is not set: the server restart is not tried")
	}
	l.halt()
	t.Logf("%d Gets, %d while passing through, %d wrong 404s; %+v", l.gets.Load(), l.passing.Load(), l.wrong.Load(), a.f.Stats())
	expectNoWrong404s(t, a, "after the broker's faults")
}
