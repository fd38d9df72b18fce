package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
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

// The key types of issue 40 through the relay: a table per type, one
// relay for all of them, rows written by another client in the forms
// applications write, and every form of every key looked up through a
// follower of the relay's stream, by its Key: each one the database finds
// a row for must not read absent, after the follower's read, the relayed
// stream, its own tagged inserts, and a start from the saved guard.

// relayKeyCase is one key type: groups of texts that are one key to the
// database, each written in its first form.
type relayKeyCase struct {
	name, typ   string
	seed, later [][]string
	own         [][]string // inserted through the Loader, tagged
}

func relayKeyCases() []relayKeyCase {
	return []relayKeyCase{
		{"character(5)", "character(5)", [][]string{{"ab", "ab   ", "ab "}, {"cde  ", "cde"}}, [][]string{{"gh", "gh   "}, {"f", "f    "}}, [][]string{{"mn", "mn  "}}},
		{"citext", "public.citext", [][]string{{"Alice@Example.com", "alice@example.com", "ALICE@EXAMPLE.COM"}, {"Émile@Exemple.fr", "émile@exemple.fr"}},
			[][]string{{"Bob@Example.com", "bob@example.com"}, {"ΣΑΣ@example.gr", "σασ@example.gr"}}, [][]string{{"Carol@Example.com", "carol@example.com"}}},
		{"numeric", "numeric", [][]string{{"1.50", "1.5", "1.500", "15e-1"}, {"4.0", "4", "04"}, {"-0.00", "0", "-0"}},
			[][]string{{"2.50", "2.5"}, {"100", "1e2", "100.000"}, {"NaN", "nan"}}, [][]string{{"7.70", "7.7"}}},
		{"double precision", "double precision", [][]string{{"0.1", "0.10", "1e-1"}, {"-0", "0", "0.0"}}, [][]string{{"1.5", "1.50"}, {"NaN", "nan"}, {"Infinity", "inf"}}, nil},
		{"real", "real", [][]string{{"0.1", "0.10"}, {"-0", "0"}}, [][]string{{"1.5", "15e-1"}}, nil},
		{"timestamptz", "timestamp with time zone", [][]string{{"2026-01-02 03:04:05+00", "2026-01-02T05:04:05+02:00", "2026-01-02 03:04:05Z", "2026-01-01 22:04:05-05"}},
			[][]string{{"2027-02-03 04:05:06.5-08", "2027-02-03 12:05:06.500Z"}}, [][]string{{"2028-01-01T01:00:00+01:00", "2028-01-01 00:00:00+00"}}},
		{"timestamp", "timestamp", [][]string{{"2026-01-02 03:04:05", "2026-01-02T03:04:05.000"}}, [][]string{{"2027-02-03", "2027-02-03 00:00:00"}}, nil},
		{"date", "date", [][]string{{"2026-01-02", "2026-1-2"}}, [][]string{{"2027-02-03", "2027-2-3"}}, nil},
		{"interval", "interval", [][]string{{"1 mon", "30 days", "720:00:00"}}, [][]string{{"1 day", "24 hours", "24:00:00"}, {"90 minutes", "01:30:00"}}, nil},
		{"inet", "inet", [][]string{{"10.0.0.1", "10.0.0.1/32"}, {"FE80::1", "fe80::1", "fe80:0:0:0:0:0:0:1"}}, [][]string{{"192.168.1.1/32", "192.168.1.1"}, {"10.1.0.0/16"}}, nil},
		{"cidr", "cidr", [][]string{{"10.0.0.0/8"}}, [][]string{{"2001:DB8::/32", "2001:db8::/32"}}, nil},
		{"bytea", "bytea", [][]string{{`\x0102FF`, `\x0102ff`, `\001\002\377`}}, [][]string{{`abc`, `\x616263`}}, nil},
		{"uuid", "uuid", [][]string{{"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "{a0eebc999c0b4ef8bb6d6bb9bd380a11}"}},
			[][]string{{"B1FFCD00-0000-4000-8000-000000000001", "b1ffcd00000040008000000000000001"}}, [][]string{{"C2000000-0000-4000-8000-000000000002", "c2000000-0000-4000-8000-000000000002"}}},
		{"bigint", "bigint", [][]string{{"7", "007", "+7"}}, [][]string{{"-42", "-042"}, {"0", "-0"}}, [][]string{{"8", "08"}}},
		{"text", "text", [][]string{{"Alice@Example.com"}, {"alice@example.com"}}, [][]string{{"Bob"}}, nil},
		{"domain over citext", "email", [][]string{{"Dave@Example.com", "dave@example.com"}}, [][]string{{"Eve@Example.com", "EVE@EXAMPLE.COM"}}, nil},
		{"domain over numeric", "amount", [][]string{{"1.50", "1.5"}}, [][]string{{"2.0", "2"}}, nil},
		{"enum", "mood", [][]string{{"happy"}}, [][]string{{"Sad"}}, nil},
	}
}

// strNode is a replica with string keys that follows a table through the
// relay's stream.
type strNode struct {
	pool   *pgxpool.Pool
	loader *guarded.Loader[string, string]
	f      *Follower[string]
	stop   func()
}

// startStrNode starts a string-keyed node of table (key column "id") and
// waits until it follows with every change committed before it started.
// With save, it saves its guard to the test's bucket once.
//
// Once, and only where asked: each object store Put of nats.go v1.55.0
// starts a goroutine that reads the publisher's status channel after Put
// may have set it to nil (object.go's deferred cleanupReplySub), and then
// blocks for good on the nil channel; goleak finds it. Saving every 100 ms
// in 18 followers left one such goroutine in 3 of 10 runs of the package,
// and saving once per table, one table at a time, in one of 6 runs.
func (e *env) startStrNode(t *testing.T, id, table string, save bool) *strNode {
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
	l, err := guarded.New(g, guarded.GetterFunc[string, string](func(context.Context, string) (string, error) { return "", nil }),
		guarded.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]Option{WithOrigin(id), WithHeartbeat(50 * time.Millisecond), WithBackoff(20 * time.Millisecond), WithRelay(e.relays[len(e.relays)-1])}, e.opts...)
	var self atomic.Pointer[Follower[string]]
	if save {
		opts = append(opts, WithSnapshots(e.bucket(), 50*time.Millisecond, func() bool {
			f := self.Load()
			return f != nil && f.Stats().SnapshotsSaved == 0
		}))
	}
	f, err := NewFollower(l, e.nc, relayed(t, e.dsn), table, "id", func(s string) (string, error) { return s, nil }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	self.Store(f)
	n := &strNode{pool: pool, loader: l, f: f}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	var once sync.Once
	n.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(func() {
		n.stop()
		l.Close()
		pool.Close()
	})
	n.waitCurrent(t)
	return n
}

func (n *strNode) waitCurrent(t *testing.T) {
	t.Helper()
	waitCurrent(t, "the string-keyed node", n.f, n.loader)
}

// lookups checks every form of every group of table through n, as an
// application looks it up: the database's answer first (a literal, whose
// type the server infers from the column), then n's Key and Loader. It
// returns the forms the database found, and the wrong 404s.
func (n *strNode) lookups(t *testing.T, db *pgx.Conn, table string, groups [][]string) (checked, wrong int) {
	t.Helper()
	ctx := context.Background()
	n.waitCurrent(t)
	for _, g := range groups {
		for _, s := range g {
			var found bool
			q := `SELECT EXISTS (SELECT FROM ` + table + ` WHERE id = $1)`
			if strings.HasPrefix(table, "keyed_enum") {
				q = `SELECT EXISTS (SELECT FROM ` + table + ` WHERE id = $1::mood)`
			}
			if err := db.QueryRow(ctx, q, pgx.QueryExecModeSimpleProtocol, s).Scan(&found); err != nil {
				t.Fatalf("look up %q in the database: %v", s, err)
			}
			if !found {
				continue
			}
			checked++
			k, err := n.f.Key(s)
			if err != nil {
				t.Logf("Key(%q): %v: the lookup goes to the store", s, err)
				continue
			}
			if !n.loader.MayContain(k) && n.loader.Ready() {
				wrong++
				t.Errorf("a wrong 404 through the relay: %q (Key: %q) in %s reads absent, and the database finds its row", s, k, table)
			}
		}
	}
	return checked, wrong
}

// ensureCitext makes sure the citext extension exists, in public.
func ensureCitext(t *testing.T, dsn string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for try := 0; ; try++ {
		_, err := c.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS citext SCHEMA public`)
		var ok bool
		if c.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citext')`).Scan(&ok); ok {
			return
		}
		if try == 3 {
			t.Skipf("citext is not available: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKeyTypesThroughRelay follows a table of each key type through one
// relay: 0 wrong 404s among every form of every key the database finds.
// With CUCKOOGUARD_RELAY_SNAPSHOTS=1 it also starts a replica of each
// table from a saved guard and looks every key up again; not by default,
// because each save can leave a goroutine of nats.go behind that goleak
// reports (see startStrNode).
func TestKeyTypesThroughRelay(t *testing.T) {
	snapshots := os.Getenv("CUCKOOGUARD_RELAY_SNAPSHOTS") != ""
	e := newEnv(t)
	ensureCitext(t, e.dsn)
	ctx := context.Background()
	e.exec(t, `CREATE DOMAIN email AS public.citext`, `CREATE DOMAIN amount AS numeric`, `CREATE TYPE mood AS ENUM ('happy', 'Sad')`)
	db, err := pgx.Connect(ctx, e.dsn+",public") // citext's operators, as the application sees them
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	cases := relayKeyCases()
	tables := make([]string, len(cases))
	for i, c := range cases {
		tables[i] = fmt.Sprintf("keyed_%s_%d", strings.Fields(strings.NewReplacer("(", " ", " ", "_").Replace(c.name))[0], i)
		if c.typ == "mood" {
			tables[i] = fmt.Sprintf("keyed_enum_%d", i)
		}
		e.exec(t, `CREATE TABLE `+tables[i]+` (id `+c.typ+` PRIMARY KEY, v text)`)
		for _, g := range c.seed {
			e.exec(t, `INSERT INTO `+tables[i]+` VALUES (`+literal(g[0])+`, 'seed')`)
		}
		if err := postgres.Publish(ctx, db, tables[i], "id"); err != nil {
			t.Fatal(err)
		}
		e.tables = append(e.tables, tables[i])
	}
	r, _ := e.startRelay(t, "keys", tables...)
	nodes := make([]*strNode, len(cases))
	for i := range cases {
		nodes[i] = e.startStrNode(t, "a", tables[i], false)
	}
	for i, c := range cases {
		for _, g := range c.later {
			e.exec(t, `INSERT INTO `+tables[i]+` VALUES (`+literal(g[0])+`, 'later')`)
		}
		n := nodes[i]
		for _, g := range c.own {
			k, err := n.f.Key(g[0])
			if err != nil {
				t.Fatal(err)
			}
			if k != g[0] {
				if _, _, err := n.f.TagQuery(g[0]); err == nil {
					t.Errorf("%s: TagQuery(%q) took a key in another form than %q", c.name, g[0], k)
				}
			}
			err = n.loader.Insert(ctx, k, func(ctx context.Context) error {
				return pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
					if err := n.f.Tag(ctx, postgres.ExecIn(tx), k); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `INSERT INTO `+tables[i]+` VALUES ($1, 'own')`, pgx.QueryExecModeSimpleProtocol, g[0])
					return err
				})
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	total := 0
	for i, c := range cases {
		all := append(append(append([][]string{}, c.seed...), c.later...), c.own...)
		checked, wrong := nodes[i].lookups(t, db, tables[i], all)
		if sk := nodes[i].f.Stats().Skipped; sk < int64(len(c.own)) {
			t.Errorf("%s: %d own inserts skipped, want %d", c.name, sk, len(c.own))
		}
		nodes[i].stop()
		total += checked
		if !snapshots {
			t.Logf("%-20s through the relay: %2d lookups the database answers with a row, %d wrong 404s", c.name, checked, wrong)
			continue
		}
		// A new replica starts from a saved guard, and reads nothing. One
		// replica saves it (once, one table at a time: see startStrNode).
		s := e.startStrNode(t, "s", tables[i], true)
		for deadline := time.Now().Add(10 * time.Second); s.f.Stats().SnapshotsSaved == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no guard saved", c.name)
			}
		}
		s.stop()
		b := e.startStrNode(t, "b", tables[i], false)
		if st := b.f.Stats(); st.SnapshotStarts != 1 || len(st.Reads) != 0 {
			t.Errorf("%s: the new replica did not start from the saved guard: %+v", c.name, st)
		}
		checkedB, wrongB := b.lookups(t, db, tables[i], all)
		b.stop()
		t.Logf("%-20s through the relay: %2d lookups the database answers with a row, %d wrong 404s; from the saved guard: %2d, %d wrong 404s",
			c.name, checked, wrong, checkedB, wrongB)
		total += checkedB
	}
	t.Logf("%d lookups checked; relay: %+v", total, r.Stats())
}

// TestKeyTypeRefusedByRelay: NewRelay and NewFollower refuse a key column
// whose equality the guard cannot hold, naming the type, the collation
// and what to do.
func TestKeyTypeRefusedByRelay(t *testing.T) {
	e := newEnv(t)
	e.exec(t, `CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`,
		`CREATE TABLE refused (id text COLLATE ci PRIMARY KEY)`)
	_, err := NewRelay(relayed(t, e.dsn), "refused", e.nc, []follow.Table{{Table: "refused", Key: "id"}}, e.opts...)
	if !errors.Is(err, postgres.ErrKeyType) || !strings.Contains(err.Error(), `collation "ci"`) || !strings.Contains(err.Error(), "deterministic collation") {
		t.Errorf("NewRelay = %v, want postgres.ErrKeyType naming the collation and the fix", err)
	}
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[string, string](func(context.Context, string) (string, error) { return "", nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = NewFollower(l, e.nc, relayed(t, e.dsn), "refused", "id", func(s string) (string, error) { return s, nil }, append(e.opts, WithRelay("refused"))...)
	if !errors.Is(err, postgres.ErrKeyType) {
		t.Errorf("NewFollower = %v, want postgres.ErrKeyType", err)
	}
}

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
