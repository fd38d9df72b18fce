package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// node is one simulated process that follows a table keyed by K: its own
// pool, Loader and Follower. replica (follower_test.go) is the int64
// users table's; node takes any table, key column and key type.
type node[K comparable] struct {
	id         string
	dsn        string
	table, key string
	parse      func(string) (K, error)
	pool       *pgxpool.Pool
	loader     *guarded.Loader[K, string]
	follower   *Follower[K]
	stop       context.CancelFunc
	done       chan error
}

// nodeConf is what startNode needs beyond the defaults.
type nodeConf struct {
	guard     []guard.Option // the Loader's guard; default WithCapacity(10_000)
	opts      []Option       // more Follower options (WithOrigin(name) and a short backoff come first)
	noWait    bool           // do not wait until it follows with every change
	following bool           // wait until it follows, with what changes it may
	followDSN string         // the follower's DSN, if not the node's
	heartbeat time.Duration  // the follower's; default hb (50 ms)
}

// startNode starts a node named name that follows table's key column and
// waits until it follows.
func startNode[K comparable](t *testing.T, dsn, table, key, name string, parse func(string) (K, error), c nodeConf) *node[K] {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	gopts := c.guard
	if gopts == nil {
		gopts = []guard.Option{guard.WithCapacity(10_000)}
	}
	g, err := guard.New(gopts...)
	if err != nil {
		t.Fatal(err)
	}
	q := fmt.Sprintf(`SELECT %s::text FROM %s WHERE %[1]s = $1`, pgx.Identifier{key}.Sanitize(), table)
	lookup := func(ctx context.Context, k K) (string, error) {
		var s string
		err := pool.QueryRow(ctx, q, k).Scan(&s)
		return s, err
	}
	l, err := guarded.New(g, guarded.GetterFunc[K, string](lookup),
		guarded.WithNotFound(func(err error) bool { return errors.Is(err, pgx.ErrNoRows) }),
		guarded.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]Option{WithOrigin(name), WithBackoff(20 * time.Millisecond), WithHeartbeat(cmp.Or(c.heartbeat, hb))}, c.opts...)
	f, err := NewFollower(l, cmp.Or(c.followDSN, dsn), table, key, parse, opts...)
	if err != nil {
		t.Fatal(err)
	}
	n := &node[K]{id: name, dsn: dsn, table: table, key: key, parse: parse, pool: pool, loader: l, follower: f}
	n.run()
	t.Cleanup(func() {
		n.halt()
		l.Close()
		pool.Close()
	})
	switch {
	case c.following:
		n.waitFollowing(t)
	case !c.noWait:
		n.waitCurrent(t)
	}
	return n
}

// waitFollowing waits until n says that it follows.
func (n *node[K]) waitFollowing(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !n.following() {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s never followed: %+v", n.id, n.follower.Stats())
		}
		runtime.Gosched()
	}
}

// insert inserts the row of key id into users through n's Loader, naming
// it with n's tag.
func (n *node[K]) insert(ctx context.Context, id K) error {
	return n.loader.Insert(ctx, id, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
			if err := n.follower.Tag(ctx, tx, id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO users (id, name) VALUES ($1, $2)`, id, n.id)
			return err
		})
	})
}

// delete deletes the row of key id from users through n's Loader.
func (n *node[K]) delete(ctx context.Context, id K) error {
	return n.loader.Delete(ctx, id, func(ctx context.Context) (bool, error) {
		tag, err := n.pool.Exec(ctx, `DELETE FROM users WHERE id = $1`, id)
		return tag.RowsAffected() > 0, err
	})
}

func (n *node[K]) run() {
	ctx, cancel := context.WithCancel(context.Background())
	n.stop, n.done = cancel, make(chan error, 1)
	go func() { n.done <- n.follower.Run(ctx) }()
}

// halt stops the follower as a stopped process would (it saves its
// snapshot file, if it has one), and returns what Run returned.
func (n *node[K]) halt() error {
	if n.stop == nil {
		return nil
	}
	n.stop()
	err := <-n.done
	n.stop = nil
	return err
}

// waitCurrent waits until n follows and every change committed before the
// call has been applied: a heartbeat sent after it came back.
func (n *node[K]) waitCurrent(t *testing.T) {
	t.Helper()
	n.waitCurrentWithin(t, 30*time.Second)
}

// currentWithin waits up to limit until n follows and every change
// committed before the call has been applied, and reports whether it did.
func (n *node[K]) currentWithin(limit time.Duration) bool {
	since := time.Now()
	for deadline := since.Add(limit); ; time.Sleep(5 * time.Millisecond) {
		st := n.follower.Stats()
		if st.State == Following && n.loader.Ready() && st.CurrentAsOf.After(since) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// waitCurrentWithin is waitCurrent, failing the test after limit.
func (n *node[K]) waitCurrentWithin(t *testing.T, limit time.Duration) {
	t.Helper()
	since := time.Now()
	deadline := since.Add(limit)
	for {
		st := n.follower.Stats()
		if st.State == Following && n.loader.Ready() && st.CurrentAsOf.After(since) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never followed with the changes before %v: state %v, last error %v, full reads %v, failures %v", n.id, since.Format(time.StampMilli), st.State, st.LastError, st.FullReads, st.FailuresByReason)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// following reports whether n says that it follows: its Loader answers
// ErrNotFound on its own.
func (n *node[K]) following() bool {
	return n.follower.Stats().State == Following && n.loader.Ready()
}

// wrong404s reads every key of the table, as the server prints it, waits
// until n is current with every change committed before the read
// (waitCurrent), and checks each key through n's Loader, as an
// application looks it up (Follower.Key): a key that a ready Loader
// reports absent while its row still exists (a writer may delete rows
// meanwhile) is a wrong 404. It returns the keys checked and the wrong
// 404s, and logs the first few.
func (n *node[K]) wrong404s(t *testing.T) (checked, wrong int) {
	t.Helper()
	keys := tableKeys(t, n.dsn, n.table, n.key)
	n.waitCurrent(t)
	for _, s := range keys {
		k, err := n.follower.Key(s)
		if err != nil {
			t.Fatalf("Key(%q): %v", s, err)
		}
		checked++
		if n.loader.MayContain(k) || !n.loader.Ready() || !n.exists(t, s) {
			continue
		}
		wrong++
		if wrong <= 5 {
			t.Logf("%s: wrong 404 for committed key %q (%v)", n.id, s, n.follower.Stats().State)
		}
	}
	return checked, wrong
}

// exists reports whether the table has a row whose key the server prints
// as text.
func (n *node[K]) exists(t *testing.T, text string) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := n.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, streamForms, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	var found bool
	q := fmt.Sprintf(`SELECT EXISTS (SELECT FROM %s WHERE format('%%s', %s) = $1)`, n.table, pgx.Identifier{n.key}.Sanitize())
	if err := tx.QueryRow(ctx, q, text).Scan(&found); err != nil {
		t.Fatal(err)
	}
	return found
}

// streamForms sets, for a transaction, the settings that shape printed
// values as a follower's stream has them (unless its DSN sets them; no
// test's does): the checks read keys in the form the replica holds them,
// whatever the role's defaults are.
const streamForms = `SET LOCAL DateStyle = 'ISO, MDY'; SET LOCAL IntervalStyle = 'postgres'; SET LOCAL TimeZone = 'UTC';
SET LOCAL extra_float_digits = 1; SET LOCAL bytea_output = 'hex'`

// tableKeys returns every key of table's key column in the server's text
// form (its output function's, as the change stream carries it).
func tableKeys(t *testing.T, dsn, table, key string) []string {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // text results
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, streamForms); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT %s FROM %s`, pgx.Identifier{key}.Sanitize(), table))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		keys = append(keys, string(rows.RawValues()[0]))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// expectNoWrong404s fails the test if n reports a committed key absent.
func expectNoWrong404s(t *testing.T, n interface {
	wrong404s(*testing.T) (int, int)
}, what string) {
	t.Helper()
	checked, wrong := n.wrong404s(t)
	t.Logf("%s: %d keys checked, %d wrong 404s", what, checked, wrong)
	if wrong != 0 {
		t.Errorf("%s: %d wrong 404s among %d committed keys", what, wrong, checked)
	}
}

// stayHonest checks, for d, that n never says it follows while a key
// committed before the call reads absent, once the staleness bound has
// passed: it may pass through (not follow), or follow with every key. It
// returns whether n said it followed at any check.
func stayHonest[K comparable](t *testing.T, n *node[K], bound, d time.Duration) (followed bool) {
	t.Helper()
	keys := tableKeys(t, n.dsn, n.table, n.key)
	start := time.Now()
	for time.Since(start) < d {
		time.Sleep(10 * time.Millisecond)
		if !n.following() || time.Since(start) < bound {
			continue
		}
		followed = true
		for _, s := range keys {
			k, err := n.follower.Key(s)
			if err != nil {
				t.Fatal(err)
			}
			if !n.loader.MayContain(k) && n.following() {
				t.Errorf("%s says it follows %v after the commit, and committed key %q reads absent (%+v)", n.id, time.Since(start).Round(time.Millisecond), s, n.follower.Stats())
				return followed
			}
		}
	}
	return followed
}

// emptyLoaderOf returns a Loader over a new default guard whose store
// finds nothing, closed at the end of the test.
func emptyLoaderOf[K comparable](t testing.TB) *guarded.Loader[K, string] {
	t.Helper()
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[K, string](func(context.Context, K) (string, error) { return "", nil }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
