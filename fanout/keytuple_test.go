package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// A multi-tenant table keyed by (tenant_id uuid, id citext), through the
// relay: the relay streams each key as its postgres.Tuple, a follower of
// the stream holds it, a tenant's key is present and the same id under
// another tenant absent, and no committed key reads absent while other
// clients insert, delete and update either key column, across a restart
// of the relay. Lookups spell the uuid in upper case in braces and the id
// in another case, through the Loader's key rule.

var memberTenants = []string{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "b1ffcd00-0d1c-4f09-8c7e-7cc0ce491b22", "c2aade11-1e2d-4a1a-9d8f-8dd1df5a2c33"}

func memberID(n int) string { return fmt.Sprintf("User%d@Example.com", n) }

func spellMember(tenant, id string) postgres.Tuple {
	swapped := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return r
	}, id)
	return postgres.TupleOf("{"+strings.ToUpper(tenant)+"}", swapped)
}

// tupleNode is a replica of members with Tuple keys, through the relay.
type tupleNode struct {
	pool   *pgxpool.Pool
	loader *guarded.Loader[postgres.Tuple, string]
	f      *Follower[postgres.Tuple]
}

func (e *env) startTupleNode(t *testing.T, id string) *tupleNode {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(guard.WithCapacity(10_000))
	if err != nil {
		t.Fatal(err)
	}
	get := func(ctx context.Context, k postgres.Tuple) (string, error) {
		texts, err := k.Texts()
		if err != nil || len(texts) != 2 {
			return "", fmt.Errorf("not a key of members: %q", k)
		}
		var s string
		err = pool.QueryRow(ctx, `SELECT name FROM members WHERE tenant_id = $1 AND id = $2`, texts[0], texts[1]).Scan(&s)
		return s, err
	}
	l, err := guarded.New(g, guarded.GetterFunc[postgres.Tuple, string](get),
		guarded.WithNotFound(func(err error) bool { return errors.Is(err, pgx.ErrNoRows) }),
		guarded.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]Option{WithOrigin(id), WithHeartbeat(50 * time.Millisecond), WithBackoff(20 * time.Millisecond), WithRelay(e.relays[len(e.relays)-1]), WithLogger(testLogger(t))}, e.opts...)
	f, err := NewFollower(l, e.nc, relayed(t, e.dsn), "members", postgres.Columns("tenant_id", "id"), postgres.ParseTuple, opts...)
	if err != nil {
		t.Fatal(err)
	}
	n := &tupleNode{pool: pool, loader: l, f: f}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		l.Close()
		pool.Close()
	})
	waitCurrent(t, id, f, l)
	return n
}

// checkWithin reads every key of members with its row version, waits
// until n is current, and counts the keys a ready Loader reports absent
// while the row version it read still exists (a key deleted and made
// again meanwhile may rightly read absent for a moment). While writers
// run flat out, a follower
// that falls behind them (its relay and it, under -race on two cores)
// passes lookups through, which is right, and may not catch up until they
// stop; if it is not current within limit the round checks nothing
// (current false). limit 0 waits for it, failing the test after 30 s.
func (n *tupleNode) checkWithin(t *testing.T, id string, limit time.Duration) (checked, wrong int, current bool) {
	t.Helper()
	ctx := context.Background()
	rows, err := n.pool.Query(ctx, `SELECT tenant_id::text, id::text, xmin::text FROM members`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([3]string, error) {
		var k [3]string
		return k, r.Scan(&k[0], &k[1], &k[2])
	})
	if err != nil {
		t.Fatal(err)
	}
	if limit == 0 {
		waitCurrent(t, id, n.f, n.loader)
	} else if !currentWithin(n.f, n.loader, limit) {
		return 0, 0, false
	}
	for _, k := range keys {
		checked++
		raw := spellMember(k[0], k[1])
		if n.loader.MayContain(raw) || !n.loader.Ready() {
			continue
		}
		var same bool
		if err := n.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM members WHERE tenant_id = $1 AND id = $2 AND xmin::text = $3)`, k[0], k[1], k[2]).Scan(&same); err != nil {
			t.Fatal(err)
		}
		if same {
			wrong++
			if wrong <= 5 {
				t.Logf("%s: wrong 404 for committed key %q, looked up as %q", id, k, raw)
			}
		}
	}
	return checked, wrong, true
}

// writeMembers starts three writers of members: inserts, deletes, and
// updates of the tenant, of the id, and of the name. The function it
// returns stops them and returns how many rows each kind changed.
func (e *env) writeMembers(t *testing.T, seed uint64) func() map[string]int64 {
	t.Helper()
	var mu sync.Mutex
	counts := map[string]int64{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var next atomic.Int64
	next.Store(1_000_000)
	for w := range 3 {
		c, err := pgx.Connect(context.Background(), e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer c.Close(context.Background())
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			const pick = `ctid = (SELECT ctid FROM members TABLESAMPLE SYSTEM (5) LIMIT 1)`
			for {
				select {
				case <-stop:
					return
				default:
				}
				tenant := memberTenants[r.IntN(len(memberTenants))]
				var op, q string
				var args []any
				switch r.IntN(5) {
				case 0, 1:
					op, q, args = "insert", `INSERT INTO members VALUES ($1, $2, 'w')`, []any{tenant, memberID(int(next.Add(1)))}
				case 2:
					op, q = "delete", `DELETE FROM members WHERE `+pick
				case 3:
					op, q, args = "update tenant", `UPDATE members SET tenant_id = $1 WHERE `+pick, []any{tenant}
				default:
					if r.IntN(2) == 0 {
						op, q, args = "update id", `UPDATE members SET id = $1 WHERE `+pick, []any{memberID(int(next.Add(1)))}
					} else {
						op, q = "update name", `UPDATE members SET name = name || '.' WHERE `+pick
					}
				}
				tag, err := c.Exec(context.Background(), q, args...)
				if err != nil {
					var pgErr interface{ SQLState() string }
					if errors.As(err, &pgErr) && pgErr.SQLState() == "23505" {
						continue // the new key exists: nothing changed
					}
					t.Errorf("%s: %v", op, err)
					return
				}
				mu.Lock()
				counts[op] += tag.RowsAffected()
				mu.Unlock()
			}
		})
	}
	var once sync.Once
	stopWriters := func() map[string]int64 {
		once.Do(func() { close(stop); wg.Wait() })
		return counts
	}
	t.Cleanup(func() { stopWriters() })
	return stopWriters
}

func TestTupleKeysThroughRelay(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	ensureCitext(t, e.dsn)
	e.exec(t, `CREATE TABLE members (tenant_id uuid, id public.citext, name text, PRIMARY KEY (tenant_id, id))`)
	var vals []string
	for i := range 400 {
		vals = append(vals, fmt.Sprintf("('%s', '%s', 'seed')", memberTenants[0], memberID(i)))
		if i >= 200 {
			vals = append(vals, fmt.Sprintf("('%s', '%s', 'seed')", memberTenants[1], memberID(i)))
		}
	}
	e.exec(t, `INSERT INTO members VALUES `+strings.Join(vals, ", "))
	key := postgres.Columns("tenant_id", "id")
	db, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	if err := postgres.Publish(ctx, db, "members", key); err != nil {
		t.Fatal(err)
	}
	e.tables = append(e.tables, "members")
	st := []follow.Table{{Table: "members", Key: key}}
	_, stopRelay := e.startRelayWith(t, "tuples", st, nil)
	n := e.startTupleNode(t, "T")

	absent, byGuard := 0, 0
	for i := range 200 {
		k := spellMember(memberTenants[1], memberID(i))
		if _, err := n.loader.Get(ctx, k); !errors.Is(err, guarded.ErrNotFound) {
			t.Fatalf("Get(%q), an id of another tenant = %v, want ErrNotFound", k, err)
		}
		absent++
		if !n.loader.MayContain(k) {
			byGuard++
		}
		if !n.loader.MayContain(spellMember(memberTenants[0], memberID(i))) {
			t.Fatalf("the first tenant's id %s reads absent", memberID(i))
		}
	}
	t.Logf("%d ids of another tenant absent, %d answered by the guard alone", absent, byGuard)
	if byGuard < absent-2 {
		t.Errorf("only %d of %d absent keys answered by the guard", byGuard, absent)
	}

	check := func(what string, limit time.Duration) {
		t.Helper()
		checked, wrong, current := n.checkWithin(t, "T", limit)
		if !current {
			t.Logf("%s: behind the writers, not checked", what)
			return
		}
		t.Logf("%s: %d keys checked, %d wrong 404s", what, checked, wrong)
		if wrong > 0 {
			t.Errorf("%s: %d wrong 404s among %d committed keys", what, wrong, checked)
		}
	}
	stopWriters := e.writeMembers(t, 1)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		check("while other clients write", 2*time.Second)
	}
	// The relay restarts while the writers go on.
	stopRelay()
	time.Sleep(200 * time.Millisecond) // writes while no relay runs
	e.startRelayWith(t, "tuples", st, nil)
	check("after the relay's restart, while other clients write", 5*time.Second)
	counts := stopWriters()
	t.Logf("writes: %v", counts)
	check("after the writes", 0)
	if counts["update tenant"] == 0 || counts["update id"] == 0 || counts["delete"] == 0 {
		t.Errorf("the writers did not change both key columns and delete: %v", counts)
	}
	// This process's own tagged inserts, spelled otherwise: the Loader's
	// rule makes them canonical, Tag names them, the follower skips them.
	for i := range 20 {
		raw := spellMember(memberTenants[2], memberID(2_000_000+i))
		k, err := n.f.Key(string(raw))
		if err != nil {
			t.Fatal(err)
		}
		texts, _ := k.Texts()
		err = n.loader.Insert(ctx, raw, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
				if err := n.f.Tag(ctx, postgres.ExecIn(tx), k); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO members VALUES ($1, $2, 'own')`, texts[0], texts[1])
				return err
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check("after own tagged inserts", 0)
}
