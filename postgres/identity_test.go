package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// The issue-48 tests: the table the guard holds, and the history it
// follows, change under a follower that says it follows. Each writes
// through another connection, checks the rows already committed through
// the follower's Loader while the fault happens, then every committed row
// once, and measures how long the follower takes to follow again.

// wrongAge is how old a row's commit must be for a 404 of it to be wrong:
// the staleness bound of the issue (DESIGN §12) with the default heartbeat.
const wrongAge = 300 * time.Millisecond

// followAgain is how soon after a fault's end the follower must follow
// again.
const followAgain = 5 * time.Second

// churnRun is replica A following users while a writer, on a connection of
// its own, commits a row at a time, and checkers read the committed rows
// through A's Loader.
type churnRun struct {
	t     *testing.T
	dsn   string
	a     *replica
	gate  sync.RWMutex // the writer holds it shared for each insert; pause takes it
	mu    sync.Mutex
	ids   []int64
	at    []time.Time    // when each commit returned
	lost  map[int64]bool // rows a restore took back, or may have: never checked again
	doubt atomic.Bool    // rows committed now may be taken back: lost
	next  atomic.Int64   // the writer's next id
	gets  atomic.Int64   // Gets of committed rows
	wrong atomic.Int64   // 404s of rows committed wrongAge or more before the Get
	early atomic.Int64   // 404s of younger rows
	stop  context.CancelFunc
	wg    sync.WaitGroup
}

// startChurn seeds users with seed rows, starts A (origin "A", the default
// heartbeat), waits until it follows, and starts the writer and checkers.
func startChurn(t *testing.T, seed int) *churnRun {
	t.Helper()
	dsn := setupUsers(t, seed)
	r := &churnRun{t: t, dsn: dsn, lost: map[int64]bool{}}
	r.a = startReplicaOn(t, dsn, dsn, "users", "A")
	r.next.Store(int64(seed) + 1_000_000)
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	r.wg.Go(func() { r.write(ctx) })
	for c := range 2 {
		r.wg.Go(func() { r.checkLoop(ctx, c) })
	}
	t.Cleanup(r.halt)
	return r
}

// write commits rows through its own connection until ctx ends,
// reconnecting when the server went away.
func (r *churnRun) write(ctx context.Context) {
	var w *pgx.Conn
	defer func() {
		if w != nil {
			w.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if w == nil || w.IsClosed() {
			c, err := pgx.Connect(ctx, r.dsn)
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			w = c
		}
		r.gate.RLock()
		id := r.next.Add(1)
		_, err := w.Exec(ctx, `INSERT INTO users VALUES ($1, 'w')`, id)
		if err == nil {
			now := time.Now()
			r.mu.Lock()
			r.ids, r.at = append(r.ids, id), append(r.at, now)
			if r.doubt.Load() {
				r.lost[id] = true
			}
			r.mu.Unlock()
		}
		r.gate.RUnlock()
		if err != nil {
			time.Sleep(5 * time.Millisecond) // outcome unknown: not checked
			continue
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// checkLoop reads committed rows through A: recent ones (c == 0) or any.
func (r *churnRun) checkLoop(ctx context.Context, c int) {
	rng := rand.New(rand.NewPCG(uint64(c), 48))
	for ctx.Err() == nil {
		r.mu.Lock()
		n := len(r.ids)
		var id int64
		var at time.Time
		if n > 0 {
			i := rng.IntN(n)
			if c == 0 {
				i = n - 1 - rng.IntN(min(n, 50))
			}
			id, at = r.ids[i], r.at[i]
		}
		r.mu.Unlock()
		if n == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		r.check(ctx, id, at)
		time.Sleep(300 * time.Microsecond)
	}
}

// check reads id, committed at at, through A's Loader and counts a 404.
func (r *churnRun) check(ctx context.Context, id int64, at time.Time) {
	begin := time.Now()
	_, err := r.a.loader.Get(ctx, id)
	r.gets.Add(1)
	if !errors.Is(err, guarded.ErrNotFound) {
		return
	}
	r.mu.Lock()
	lost := r.lost[id]
	r.mu.Unlock()
	switch age := begin.Sub(at); {
	case lost:
	case age >= wrongAge:
		if r.wrong.Add(1) <= 5 {
			r.t.Logf("A: Get(%d) = ErrNotFound %v after its commit; follower %+v", id, age.Round(time.Millisecond), r.a.follower.Stats())
		}
	default:
		r.early.Add(1)
	}
}

// pause waits for the writer's insert in flight, and holds the next.
func (r *churnRun) pause()  { r.gate.Lock() }
func (r *churnRun) resume() { r.gate.Unlock() }

// forget marks the rows committed after the first n as lost (a restore
// took them back): they are not checked again.
func (r *churnRun) forget(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range r.ids[n:] {
		r.lost[id] = true
	}
}

// committed returns how many rows the writer has committed.
func (r *churnRun) committed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// following reports whether A says it follows.
func (r *churnRun) following() bool {
	return r.a.follower.Stats().State == Following && r.a.loader.Ready()
}

// waitFollowing waits until A follows, and returns how long after from it
// did. After limit it marks the test failed and returns limit: the run
// goes on, to count the wrong 404s.
func (r *churnRun) waitFollowing(from time.Time, limit time.Duration) time.Duration {
	r.t.Helper()
	for !r.following() {
		if time.Since(from) > limit {
			r.t.Errorf("A not following %v after the fault's end: %+v", limit, r.a.follower.Stats())
			return limit
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(from)
}

// finish lets the run go on for a while, stops the writer, waits until every
// row is wrongAge old, checks every committed row once, stops the checkers,
// logs the counts as what (with more), and fails the test on a wrong 404.
func (r *churnRun) finish(what string, more string) {
	r.t.Helper()
	time.Sleep(500 * time.Millisecond)
	r.pause()
	time.Sleep(wrongAge + 50*time.Millisecond)
	ctx := context.Background()
	r.mu.Lock()
	ids, at := append([]int64(nil), r.ids...), append([]time.Time(nil), r.at...)
	r.mu.Unlock()
	// A heartbeat late on a loaded machine passes lookups through for a
	// moment: that is not a follower that stopped following.
	following := r.following()
	for from := time.Now(); !following && time.Since(from) < followAgain; following = r.following() {
		time.Sleep(time.Millisecond)
	}
	for i, id := range ids {
		r.check(ctx, id, at[i])
	}
	r.resume()
	r.halt()
	r.mu.Lock()
	lost := len(r.lost)
	r.mu.Unlock()
	r.t.Logf("%s: %d rows committed (%d lost to a restore, or committed during it), %d lookups of committed rows, %d wrong 404s, %d 404s younger than %v; %s; A following at the sweep: %v; A %+v",
		what, len(ids), lost, r.gets.Load(), r.wrong.Load(), r.early.Load(), wrongAge, more, following, r.a.follower.Stats())
	if n := r.wrong.Load(); n > 0 {
		r.t.Fatalf("%s: %d wrong 404s", what, n)
	}
	if !following {
		r.t.Fatalf("%s: A did not follow at the sweep", what)
	}
}

func (r *churnRun) halt() {
	r.stop()
	r.wg.Wait()
}

// TestIdentityChanges changes which table the name users resolves to, or
// what its publication holds, under a follower that follows it with the
// default heartbeat, while another connection writes: each change must end
// "following" at the first heartbeat after it (0 wrong 404s), and the
// follower must read the table the name now resolves to and follow it
// within followAgain of the change's end (the table published).
func TestIdentityChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before string // run first, outside the change
		change string // one transaction, under which the writer waits; {pub} is the publication
		after  func(t *testing.T, ctx context.Context, db *pgx.Conn, pub string)
	}{{
		// A migration's swap: the new table holds every row, under the
		// name the application queries; the old one keeps its
		// publication.
		name:   "rename swap",
		before: `CREATE TABLE users_new (LIKE users INCLUDING ALL); INSERT INTO users_new SELECT * FROM users`,
		change: `LOCK TABLE users IN EXCLUSIVE MODE;
			INSERT INTO users_new SELECT * FROM users u WHERE NOT EXISTS (SELECT FROM users_new n WHERE n.id = u.id);
			ALTER TABLE users RENAME TO users_old; ALTER TABLE users_new RENAME TO users`,
		after: republish,
	}, {
		// DROP TABLE and CREATE TABLE of the same name, with the rows
		// carried over so that every committed row stays.
		name: "drop and create",
		change: `LOCK TABLE users IN EXCLUSIVE MODE;
			CREATE TEMP TABLE carried ON COMMIT DROP AS SELECT * FROM users;
			DROP TABLE users;
			CREATE TABLE users (id BIGINT PRIMARY KEY, name TEXT NOT NULL);
			INSERT INTO users SELECT * FROM carried`,
		after: republish,
	}, {
		// The table taken out of its publication and, a moment later, put
		// back; rows committed meanwhile are not in the stream.
		name:   "publication drop and add",
		change: `ALTER PUBLICATION {pub} DROP TABLE users`,
		after: func(t *testing.T, ctx context.Context, db *pgx.Conn, pub string) {
			time.Sleep(500 * time.Millisecond)
			if _, err := db.Exec(ctx, `ALTER PUBLICATION `+pub+` ADD TABLE users (id)`); err != nil {
				t.Fatal(err)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := startChurn(t, 1000)
			ctx := context.Background()
			db := connect(t, r.dsn)
			pub := publication(t, r.dsn)
			if tc.before != "" {
				if _, err := db.Exec(ctx, tc.before); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(500 * time.Millisecond)
			if r.waitFollowing(time.Now(), followAgain); !r.following() {
				t.Fatalf("A not following before the change: %+v", r.a.follower.Stats())
			}
			change := time.Now()
			if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, strings.ReplaceAll(tc.change, "{pub}", pub))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			committed := time.Now()
			// The first heartbeat after the change ends "following".
			for r.following() && time.Since(committed) < 2*time.Second {
				time.Sleep(100 * time.Microsecond)
			}
			noticed := time.Since(committed)
			tc.after(t, ctx, db, pub)
			end := time.Now()
			back := r.waitFollowing(end, followAgain)
			r.finish(tc.name, fmt.Sprintf("change committed in %v, A stopped following %v after it, following again %v after the fault's end (%v after the change)",
				committed.Sub(change).Round(time.Millisecond), noticed.Round(time.Millisecond), back.Round(time.Millisecond), end.Add(back).Sub(committed).Round(time.Millisecond)))
			if noticed >= 2*time.Second {
				t.Fatalf("%s: A still following 2 s after the change", tc.name)
			}
		})
	}
}

// republish publishes users again, as a deployment that changed the table
// would (Publish must work without manual cleanup).
func republish(t *testing.T, ctx context.Context, db *pgx.Conn, _ string) {
	t.Helper()
	if err := Publish(ctx, db, "users", "id"); err != nil {
		t.Errorf("Publish after the change: %v", err) // the run goes on, to count the wrong 404s
	}
}
