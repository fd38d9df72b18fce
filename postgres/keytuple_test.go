package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// Multi-tenant tables keyed by (tenant_id, id), followed as keys of two
// columns: a tenant's key is present, the same id under another tenant
// is absent, and no committed key reads absent while other clients insert,
// delete and update either key column, through the logical follower and
// the NOTIFY one. Lookups spell each column as a client might (an
// upper-case uuid in braces, a citext id in another case, numeric 1.50
// for 1.5, +7 for 7) and go through the Loader, whose key rule makes each
// canonical.

// tenantCase is a multi-tenant table's key types, and how a client may
// spell each column's value otherwise.
type tenantCase struct {
	name            string
	tenantT, idT    string
	tenants         []string            // tenant ids, as the server prints them
	id              func(n int) string  // the n-th id, as a client writes it
	spellT, spellID func(string) string // another spelling of a printed value
}

func swapCase(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return r
	}, s)
}

var tenantCases = []tenantCase{
	{
		name: "uuid,citext", tenantT: "uuid", idT: "public.citext",
		tenants: []string{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "b1ffcd00-0d1c-4f09-8c7e-7cc0ce491b22", "c2aade11-1e2d-4a1a-9d8f-8dd1df5a2c33"},
		id:      func(n int) string { return fmt.Sprintf("User%d@Example.com", n) },
		spellT:  func(s string) string { return "{" + strings.ToUpper(s) + "}" },
		spellID: swapCase,
	},
	{
		name: "int,numeric", tenantT: "int4", idT: "numeric",
		tenants: []string{"7", "8", "9"},
		id:      func(n int) string { return fmt.Sprintf("%d.%d0", n/10, n%10) },
		spellT:  func(s string) string { return "+" + s },
		spellID: func(s string) string {
			if strings.Contains(s, ".") {
				return s + "00"
			}
			return s + ".000"
		},
	},
}

// createMembers creates the members table of tc in dsn's schema, with
// rows of ids 0..n-1 for the first tenant and n/2..n-1 for the second.
func createMembers(t *testing.T, dsn string, tc tenantCase, n int) {
	t.Helper()
	execAll(t, dsn, fmt.Sprintf(`CREATE TABLE members (tenant_id %s, id %s, name text, PRIMARY KEY (tenant_id, id))`, tc.tenantT, tc.idT))
	var vals []string
	for i := range n {
		vals = append(vals, fmt.Sprintf("(%s, %s, 'seed')", quoteLiteral(tc.tenants[0]), quoteLiteral(tc.id(i))))
		if i >= n/2 {
			vals = append(vals, fmt.Sprintf("(%s, %s, 'seed')", quoteLiteral(tc.tenants[1]), quoteLiteral(tc.id(i))))
		}
	}
	execAll(t, dsn, `INSERT INTO members VALUES `+strings.Join(vals, ", "))
}

// startMembers starts a node that follows members by (tenant_id, id), with
// Tuple keys; its store finds a row by both columns.
func startMembers(t *testing.T, dsn, name string, opts ...Option) *node[Tuple] {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(guard.WithCapacity(10_000))
	if err != nil {
		t.Fatal(err)
	}
	get := func(ctx context.Context, k Tuple) (string, error) {
		texts, err := k.Texts()
		if err != nil || len(texts) != 2 {
			return "", fmt.Errorf("not a key of members: %q", k)
		}
		var s string
		err = pool.QueryRow(ctx, `SELECT name FROM members WHERE tenant_id = $1 AND id = $2`, texts[0], texts[1]).Scan(&s)
		return s, err
	}
	l, err := guarded.New(g, guarded.GetterFunc[Tuple, string](get),
		guarded.WithNotFound(func(err error) bool { return errors.Is(err, pgx.ErrNoRows) }),
		guarded.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	key := Columns("tenant_id", "id")
	opts = append([]Option{WithOrigin(name), WithBackoff(20 * time.Millisecond), WithHeartbeat(hb)}, opts...)
	f, err := NewFollower(l, dsn, "members", key, ParseTuple, opts...)
	if err != nil {
		t.Fatal(err)
	}
	n := &node[Tuple]{id: name, dsn: dsn, table: "members", key: key, parse: ParseTuple, pool: pool, loader: l, follower: f}
	n.run()
	t.Cleanup(func() {
		n.halt()
		l.Close()
		pool.Close()
	})
	n.waitCurrent(t)
	return n
}

// memberKeys returns every key of members, each column as the server
// prints it, and the xmin of its row's version.
func memberKeys(t *testing.T, c *pgx.Conn) [][3]string {
	t.Helper()
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, streamForms, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `SELECT tenant_id::text, id::text, xmin::text FROM members`)
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
	return keys
}

// memberExists reports whether members still has the row version k (its
// key and xmin) that memberKeys read: a key that was deleted and made
// again since (another tenant's row moved to it) may read absent for a
// while, rightly, and is not counted; a row updated otherwise is not
// either.
func memberExists(t *testing.T, c *pgx.Conn, k [3]string) bool {
	t.Helper()
	var found bool
	if err := c.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM members WHERE tenant_id = $1 AND id = $2 AND xmin::text = $3)`, k[0], k[1], k[2]).Scan(&found); err != nil {
		t.Fatal(err)
	}
	return found
}

// checkMembers reads every key of members, waits until n is current with
// the changes committed before the read, and looks each up through n's
// Loader, spelled as tc's clients may: a key that a ready Loader reports
// absent while its row still exists is a wrong 404. It returns the keys
// checked and the wrong 404s.
func checkMembers(t *testing.T, n *node[Tuple], c *pgx.Conn, tc tenantCase) (checked, wrong int) {
	t.Helper()
	keys := memberKeys(t, c)
	n.waitCurrent(t)
	return checkMemberKeys(t, n, c, tc, keys)
}

// checkMembersWhileWriting is checkMembers while writers run flat out: a
// follower that falls behind them (three writers without a pause against
// a -race build, on two cores) passes lookups through, which is right,
// and may not catch up until they stop; such a round checks nothing
// (current reports false). Rounds that it does check are held to 0 wrong
// 404s.
func checkMembersWhileWriting(t *testing.T, n *node[Tuple], c *pgx.Conn, tc tenantCase) (checked, wrong int, current bool) {
	t.Helper()
	keys := memberKeys(t, c)
	if !n.currentWithin(2 * time.Second) {
		return 0, 0, false
	}
	checked, wrong = checkMemberKeys(t, n, c, tc, keys)
	return checked, wrong, true
}

// checkMemberKeys looks keys up, once n is current with them.
func checkMemberKeys(t *testing.T, n *node[Tuple], c *pgx.Conn, tc tenantCase, keys [][3]string) (checked, wrong int) {
	t.Helper()
	for _, k := range keys {
		checked++
		raw := TupleOf(tc.spellT(k[0]), tc.spellID(k[1]))
		if n.loader.MayContain(raw) || !n.loader.Ready() || !memberExists(t, c, k) {
			continue
		}
		wrong++
		if wrong <= 5 {
			canon, err := n.follower.Key(string(raw))
			st := n.follower.Stats()
			t.Logf("%s: wrong 404 for committed key %q, looked up as %q (Key %q, %v; %v, failures %v, full reads %v, guard %+v)",
				n.id, k, raw, canon, err, st.State, st.FailuresByReason, st.FullReads, n.loader.Stats())
		}
	}
	return checked, wrong
}

// churnWrong404s fails the test for wrong 404s found by checks made
// while other clients write (TestChurnWrong404 names their cause, fixed:
// a deletion applied before its transaction was visible).
func churnWrong404s(t *testing.T, wrong, checked int) {
	t.Helper()
	if wrong > 0 {
		t.Errorf("%d wrong 404s among %d committed keys checked while other clients wrote", wrong, checked)
	}
}

// writeMembers starts writers of members, through their own
// connections: inserts, deletes, updates of the tenant, of the id, and of
// neither (the name). The function it returns stops them, and returns how
// many of each committed.
func writeMembers(t *testing.T, dsn string, tc tenantCase, seed uint64) (stopWriters func() map[string]int64) {
	t.Helper()
	var mu sync.Mutex
	counts := map[string]int64{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var next atomic.Int64
	next.Store(1_000_000)
	for w := range 3 {
		c := connect(t, dsn)
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			ctx := context.Background()
			for {
				select {
				case <-stop:
					return
				default:
				}
				tenant := func() string { return tc.tenants[r.IntN(len(tc.tenants))] }
				var op, q string
				var args []any
				switch r.IntN(5) {
				case 0, 1:
					op, q, args = "insert", `INSERT INTO members VALUES ($1, $2, 'w')`, []any{tenant(), tc.id(int(next.Add(1)))}
				case 2:
					op, q = "delete", `DELETE FROM members WHERE ctid = (SELECT ctid FROM members TABLESAMPLE SYSTEM (5) LIMIT 1)`
				case 3:
					op, q, args = "update tenant", `UPDATE members SET tenant_id = $1 WHERE ctid = (SELECT ctid FROM members TABLESAMPLE SYSTEM (5) LIMIT 1)`, []any{tenant()}
				default:
					if r.IntN(2) == 0 {
						op, q, args = "update id", `UPDATE members SET id = $1 WHERE ctid = (SELECT ctid FROM members TABLESAMPLE SYSTEM (5) LIMIT 1)`, []any{tc.id(int(next.Add(1)))}
					} else {
						op, q = "update name", `UPDATE members SET name = name || '.' WHERE ctid = (SELECT ctid FROM members TABLESAMPLE SYSTEM (5) LIMIT 1)`
					}
				}
				tag, err := c.Exec(ctx, q, args...)
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
	stopWriters = func() map[string]int64 {
		once.Do(func() { close(stop); wg.Wait() })
		return counts
	}
	t.Cleanup(func() { stopWriters() })
	return stopWriters
}

func TestTupleKeysMultiTenant(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []Option
	}{{"logical", []Option{}}, {"notify", []Option{WithNotify()}}} {
		for _, tc := range tenantCases {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				db, _ := pgConn(t)
				ensureCitext(t, db)
				dsn := dsnOf(t, db)
				createMembers(t, dsn, tc, 400)
				key := Columns("tenant_id", "id")
				opts := mode.opts
				logical := len(opts) == 0
				if logical {
					file := filepath.Join(t.TempDir(), "members.guard")
					opts = []Option{WithSnapshotFile(file), WithSnapshotInterval(10 * time.Millisecond)}
					if err := Publish(ctx, db, "members", key); err != nil {
						t.Fatal(err)
					}
				} else if err := Install(ctx, db, "members", key); err != nil {
					t.Fatal(err)
				}
				n := startMembers(t, dsn, "A", opts...)
				c := connect(t, dsn)

				// The first tenant's ids 0..199 are not the second's:
				// absent under it, and the guard says so alone (while the
				// follower follows: a heartbeat late on a loaded machine
				// passes lookups through, as it must).
				absent, byGuard := 0, 0
				for i := range 200 {
					k := TupleOf(tc.spellT(tc.tenants[1]), tc.id(i))
					if _, err := n.loader.Get(ctx, k); !errors.Is(err, guarded.ErrNotFound) {
						t.Fatalf("Get(%q), an id of another tenant = %v, want ErrNotFound", k, err)
					}
					n.waitFollowing(t)
					fenced := n.follower.Stats().Failures
					rejected := !n.loader.MayContain(k)
					if !n.following() || n.follower.Stats().Failures != fenced {
						continue // the state changed around the lookup: it proves nothing
					}
					absent++
					if rejected {
						byGuard++
					}
					if !n.loader.MayContain(TupleOf(tc.spellT(tc.tenants[0]), tc.spellID(tc.id(i)))) {
						t.Fatalf("the first tenant's id %s reads absent", tc.id(i))
					}
				}
				t.Logf("%d ids of another tenant absent, %d answered by the guard alone", absent, byGuard)
				if absent < 50 {
					t.Errorf("only %d of 200 lookups were made while the follower followed", absent)
				}
				if byGuard < absent-2 {
					t.Errorf("only %d of %d absent keys answered by the guard", byGuard, absent)
				}
				// A key of one column, or one the rule cannot read, goes to
				// the store: never a wrong 404, never a panic.
				for _, k := range []Tuple{TupleOf(tc.tenants[0]), TupleOf(tc.tenants[0], tc.id(1), "x"), TupleOf("not a "+tc.tenantT, tc.id(1)), "garbage"} {
					if !n.loader.MayContain(k) {
						t.Errorf("MayContain(%q), a key the rule cannot judge = false, want a pass-through", k)
					}
				}

				stopWriters := writeMembers(t, dsn, tc, 1)
				var during, wrongDuring, rounds, behind int
				for end := time.Now().Add(2 * time.Second); time.Now().Before(end); rounds++ {
					ch, w, current := checkMembersWhileWriting(t, n, c, tc)
					during, wrongDuring = during+ch, wrongDuring+w
					if !current {
						behind++
					}
				}
				counts := stopWriters()
				checked, wrong := checkMembers(t, n, c, tc)
				t.Logf("%s: writes %v; %d rounds while writing (%d behind the writers, not checked): %d keys checked, %d wrong 404s; after: %d keys checked, %d wrong 404s",
					tc.name, counts, rounds, behind, during, wrongDuring, checked, wrong)
				if wrong != 0 {
					t.Errorf("%d wrong 404s among %d committed keys after the writes", wrong, checked)
				}
				if wrongDuring != 0 {
					churnWrong404s(t, wrongDuring, during)
				}
				if counts["update tenant"] == 0 || counts["update id"] == 0 || counts["delete"] == 0 {
					t.Errorf("the writers did not change both key columns and delete: %v", counts)
				}

				// This process's own inserts, tagged, each column in
				// another spelling: the Loader's rule makes the key
				// canonical, the Tag names it, the follower skips it.
				for i := range 20 {
					raw := TupleOf(tc.spellT(tc.tenants[2]), tc.spellID(tc.id(2_000_000+i)))
					k, err := n.follower.Key(string(raw))
					if err != nil {
						t.Fatal(err)
					}
					texts, _ := k.Texts()
					err = n.loader.Insert(ctx, raw, func(ctx context.Context) error {
						return pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
							if err := n.follower.Tag(ctx, tx, k); err != nil {
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
				checked, wrong = checkMembers(t, n, c, tc)
				t.Logf("after own tagged inserts: %d keys checked, %d wrong 404s; %d inserts skipped", checked, wrong, n.follower.Stats().Skipped)
				if wrong != 0 {
					t.Errorf("%d wrong 404s among %d committed keys", wrong, checked)
				}
				if !logical {
					return
				}
				// A restart from the snapshot file, with rows written
				// while the process was away.
				n.halt()
				stopWriters = writeMembers(t, dsn, tc, 2)
				time.Sleep(300 * time.Millisecond) // writes while no process follows
				counts = stopWriters()
				r := startMembers(t, dsn, "A", opts...)
				checked, wrong = checkMembers(t, r, c, tc)
				st := r.follower.Stats()
				t.Logf("restarted from the snapshot file (%v full reads, %d restores) after writes %v: %d keys checked, %d wrong 404s", st.FullReads, st.SnapshotStart, counts, checked, wrong)
				if wrong != 0 {
					t.Errorf("%d wrong 404s among %d committed keys", wrong, checked)
				}
				if st.SnapshotStart != 1 {
					t.Errorf("%d restores from the snapshot file, want 1", st.SnapshotStart)
				}
			})
		}
	}
}

// TestTupleKeysRefused: what cannot be followed as a key of several
// columns is refused with an error that says why: columns that are not
// the replica identity, all of it; a column of a type the guard cannot
// hold, named; a column list that names no column or one twice.
func TestTupleKeysRefused(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn,
		`CREATE TABLE members (tenant_id int, id text, name text, PRIMARY KEY (tenant_id, id))`,
		`CREATE TABLE ided (tenant_id int NOT NULL, id text PRIMARY KEY)`,
		`CREATE TABLE money_keyed (tenant_id int, m money, PRIMARY KEY (tenant_id, m))`)
	for _, tc := range []struct {
		table, key string
		want       error
		says       string
	}{
		{"members", "id", ErrKeyNotIdentity, "its replica identity is (id, tenant_id), not (id)"},
		{"members", Columns("tenant_id", "name"), ErrKeyNotIdentity, "not (name, tenant_id)"},
		{"members", Columns("tenant_id", "id", "name"), ErrKeyNotIdentity, "not (id, name, tenant_id)"},
		{"ided", Columns("tenant_id", "id"), ErrKeyNotIdentity, "its replica identity is (id)"},
		{"money_keyed", Columns("tenant_id", "m"), ErrKeyType, `key column "m" of table`},
		{"members", Columns("tenant_id", "tenant_id"), nil, `"tenant_id" twice`},
		{"members", "tenant_id,id", nil, "postgres.Columns"},
	} {
		err := Publish(ctx, db, tc.table, tc.key)
		t.Logf("Publish(%s, %q): %v", tc.table, tc.key, err)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Publish(%s, %q) = %v, want %v saying %q", tc.table, tc.key, err, tc.want, tc.says)
		}
	}
	if err := Publish(ctx, db, "members", Columns("id", "tenant_id")); err != nil {
		t.Errorf("Publish of the primary key's columns in another order = %v", err)
	}
	if _, err := NewFollower(emptyLoaderOf[Tuple](t), dsn, "members", Columns("id", ""), ParseTuple); err == nil {
		t.Error("NewFollower of a column without a name: no error")
	}
	if err := Install(ctx, db, "members", Columns("id", "id")); err == nil {
		t.Error("Install of a column twice: no error")
	}
}

// TestTupleKeysNullNotify: through the NOTIFY trigger, which needs no
// replica identity, a key of two columns of a unique index may have a
// NULL: such a row has no key (no lookup names it, no equality finds it),
// and an update into or out of a NULL deletes or inserts the key that
// exists; the read skips such rows alike. Nothing fails the session.
func TestTupleKeysNullNotify(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn, `CREATE TABLE members (tenant_id int, id text, name text, UNIQUE (tenant_id, id))`,
		`INSERT INTO members VALUES (7, 'a', 'seed'), (NULL, 'b', 'seed'), (7, NULL, 'seed'), (8, 'c', 'seed')`)
	if err := Install(ctx, db, "members", Columns("tenant_id", "id")); err != nil {
		t.Fatal(err)
	}
	n := startMembers(t, dsn, "N", WithNotify())
	execAll(t, dsn,
		`INSERT INTO members VALUES (9, 'd', 'w'), (NULL, 'e', 'w')`,
		`UPDATE members SET tenant_id = 9 WHERE id = 'b'`,    // NULL → (9, b): an insert
		`UPDATE members SET tenant_id = NULL WHERE id = 'c'`, // (8, c) → NULL: a delete
		`UPDATE members SET id = 'f' WHERE id IS NULL`,       // (7, NULL) → (7, f)
		`DELETE FROM members WHERE id = 'e'`)
	n.waitCurrent(t)
	for _, tc := range []struct {
		tenant, id string
		present    bool
	}{{"7", "a", true}, {"9", "d", true}, {"9", "b", true}, {"7", "f", true}, {"8", "c", false}} {
		if got := n.loader.MayContain(TupleOf(tc.tenant, tc.id)); got != tc.present && (tc.present || got) {
			t.Errorf("(%s, %s): present %v, want %v", tc.tenant, tc.id, got, tc.present)
		}
	}
	if st := n.follower.Stats(); st.Resyncs != 1 || len(st.FailuresByReason) != 0 {
		t.Errorf("the session failed or read again: %d reads, failures %v", st.Resyncs, st.FailuresByReason)
	}
}
