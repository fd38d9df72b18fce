package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/internal/keyspell"
)

// The key types of issue 40: a table per type, rows written by another
// client in the forms applications write (case, padding, scale, time
// zones, units), and every form of every key looked up: each one the
// database finds a row for must not read absent through the follower,
// whatever path brought the key (the read, the stream, the NOTIFY
// trigger, the snapshot file, the Loader's own tagged insert).

// keyTypeCase is one key type: the groups of texts that are one key to
// the database, each written in its first form.
type keyTypeCase struct {
	name, typ string     // typ as the table's key column is declared
	setup     []string   // statements before the table: a type, an extension
	seed      [][]string // written before the follower starts: read
	later     [][]string // written while it follows: streamed
	own       [][]string // inserted through the Loader in the first form, tagged
	lookup    string     // a lookup's condition, if not "k = $1" (a domain over an enum has no =)
}

// keyTypeCases are the types of the issue, with the examples:
// the spellings of package keyspell, which examples/integration sends
// through the HTTP middleware and rpcguard too.
func keyTypeCases() []keyTypeCase {
	var cs []keyTypeCase
	for _, s := range keyspell.Types() {
		cs = append(cs, keyTypeCase{name: s.Name, typ: s.Type, setup: s.Setup, seed: s.Seed, later: s.Later, own: s.Own, lookup: s.Lookup})
	}
	return cs
}

// keyTypeSchema prepares db's schema for c's table: its setup, and c's
// type or a domain over it. It returns the column type and a DSN whose
// search_path sees public (citext's operators).
func keyTypeSchema(t *testing.T, db *pgx.Conn, c keyTypeCase, domain bool) (typ, dsn string) {
	t.Helper()
	ctx := context.Background()
	for _, s := range c.setup {
		if s == "citext" {
			ensureCitext(t, db)
			continue
		}
		if _, err := db.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	typ = c.typ
	if domain {
		if _, err := db.Exec(ctx, `CREATE DOMAIN key_domain AS `+c.typ); err != nil {
			t.Fatal(err)
		}
		typ = "key_domain"
	}
	return typ, dsnOf(t, db) + ",public"
}

// lookups checks every form of every group through a: each form the
// database finds a row for must not read absent. It returns the forms
// the database found, the wrong 404s, and the forms Key could not judge
// (passed to the store).
func lookups(t *testing.T, dsn, table, lookup string, key func(string) (string, error), mayContain func(string) bool, ready func() bool, groups [][]string) (checked, wrong, undecided int) {
	t.Helper()
	ctx := context.Background()
	db := connect(t, dsn)
	for _, g := range groups {
		for _, s := range g {
			var found bool
			// As an application looks a key up: a text parameter, which the
			// server reads as the column's type.
			// (The simple protocol sends it as a literal, whose type the
			// server infers from the column, as a parameter's.)
			if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+table+` WHERE `+cmp.Or(lookup, "k = $1")+`)`, pgx.QueryExecModeSimpleProtocol, s).Scan(&found); err != nil {
				t.Fatalf("look up %q in the database: %v", s, err)
			}
			if !found {
				continue
			}
			checked++
			k, err := key(s)
			if err != nil {
				undecided++
				t.Logf("Key(%q): %v: the lookup goes to the store", s, err)
				continue
			}
			if !mayContain(k) && ready() {
				wrong++
				t.Errorf("a wrong 404: %q (Key: %q) reads absent, and the database finds its row", s, k)
			}
		}
	}
	return checked, wrong, undecided
}

// insertGroups writes the first form of each group, as another client.
func insertGroups(t *testing.T, dsn, table string, groups [][]string) {
	t.Helper()
	for _, g := range groups {
		execAll(t, dsn, `INSERT INTO `+table+` VALUES (`+quoteLiteral(g[0])+`, 'other')`)
	}
}

// TestKeyTypesDirect follows a table of each key type, and of a domain
// over it, with a direct follower that reads the table, streams, inserts
// through its Loader, and restarts from its snapshot file; and with a
// NOTIFY follower. Every form of every key the database finds is looked
// up: 0 wrong 404s.
func TestKeyTypesDirect(t *testing.T) {
	ctx := context.Background()
	total := map[string][2]int{}
	for _, c := range keyTypeCases() {
		for _, domain := range []bool{false, true} {
			name := c.name
			if domain {
				name = "domain over " + c.name
			}
			t.Run(name, func(t *testing.T) {
				db, _ := pgConn(t)
				typ, dsn := keyTypeSchema(t, db, c, domain)
				execAll(t, dsn, `CREATE TABLE keyed (k `+typ+` PRIMARY KEY, v text)`)
				insertGroups(t, dsn, "keyed", c.seed)
				if err := Publish(ctx, db, "keyed", "k"); err != nil {
					t.Fatal(err)
				}
				file := filepath.Join(t.TempDir(), "keyed.guard")
				conf := nodeConf{opts: []Option{WithSnapshotFile(file), WithSnapshotInterval(10 * time.Millisecond)}}
				a := startNode(t, dsn, "keyed", "k", "A", parseText, conf)
				insertGroups(t, dsn, "keyed", c.later)
				for _, g := range c.own {
					k, err := a.follower.Key(g[0])
					if err != nil {
						t.Fatal(err)
					}
					if g[0] != k {
						// The form the table stores is not the one Tag takes.
						if _, _, err := a.follower.TagQuery(g[0]); err == nil || !strings.Contains(err.Error(), "canonical form") {
							t.Errorf("TagQuery(%q) = %v, want an error about the canonical form %q", g[0], err, k)
						}
					}
					err = a.loader.Insert(ctx, k, func(ctx context.Context) error {
						return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
							if err := a.follower.Tag(ctx, tx, k); err != nil {
								return err
							}
							_, err := tx.Exec(ctx, `INSERT INTO keyed VALUES ($1, 'own')`, pgx.QueryExecModeSimpleProtocol, g[0])
							return err
						})
					})
					if err != nil {
						t.Fatal(err)
					}
				}
				a.waitCurrent(t)
				all := append(append(append([][]string{}, c.seed...), c.later...), c.own...)
				check := func(what string, n *node[string]) {
					t.Helper()
					checked, wrong, undecided := lookups(t, dsn, "keyed", c.lookup, n.follower.Key, n.loader.MayContain, n.loader.Ready, all)
					t.Logf("%s: %d lookups the database answers with a row, %d wrong 404s, %d passed to the store", what, checked, wrong, undecided)
					// And as a caller who forgets Key: the raw text, straight
					// to the Loader, whose key rule the follower installed.
					raw := func(s string) (string, error) { return s, nil }
					rchecked, rwrong, _ := lookups(t, dsn, "keyed", c.lookup, raw, n.loader.MayContain, n.loader.Ready, all)
					t.Logf("%s, raw spellings through the Loader: %d lookups, %d wrong 404s", what, rchecked, rwrong)
					tt := total[c.name]
					total[c.name] = [2]int{tt[0] + checked + rchecked, tt[1] + wrong + rwrong}
					if checked == 0 {
						t.Errorf("%s: no lookup checked", what)
					}
				}
				check("read, streamed and own", a)
				if st := a.follower.Stats(); len(c.own) > 0 && st.Skipped != int64(len(c.own)) {
					t.Errorf("%d own inserts skipped, want %d: the tag did not name the streamed key", st.Skipped, len(c.own))
				}
				if err := a.halt(); !errors.Is(err, context.Canceled) {
					t.Fatal(err)
				}
				b := startNode(t, dsn, "keyed", "k", "A", parseText, conf)
				if st := b.follower.Stats(); st.SnapshotStart != 1 {
					t.Errorf("the restart read the table (%v): the snapshot file was not used", st.FullReads)
				}
				check("restarted from the snapshot file", b)
				b.halt()
				if domain {
					return
				}
				if err := Install(ctx, db, "keyed", "k"); err != nil {
					t.Fatal(err)
				}
				n := startNode(t, dsn, "keyed", "k", "N", parseText, nodeConf{opts: []Option{WithNotify()}})
				execAll(t, dsn, `DELETE FROM keyed`)
				insertGroups(t, dsn, "keyed", c.seed)
				insertGroups(t, dsn, "keyed", c.later)
				n.waitCurrent(t)
				check("NOTIFY trigger", n)
			})
		}
	}
	sum := [2]int{}
	for _, c := range keyTypeCases() {
		t.Logf("%-18s %4d lookups checked, %d wrong 404s", c.name, total[c.name][0], total[c.name][1])
		sum[0], sum[1] = sum[0]+total[c.name][0], sum[1]+total[c.name][1]
	}
	t.Logf("all types: %d lookups the database answers with a row, checked through the follower; %d wrong 404s", sum[0], sum[1])
}

// TestKeyTypesRefused: a key column whose equality the guard cannot hold
// is refused by Publish, Install, NewFollower, newSource and ReadTable,
// with an error that names the type, the collation where it is the cause,
// and what to do.
func TestKeyTypesRefused(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn, `CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`,
		`CREATE DOMAIN ci_text AS text COLLATE ci`)
	for _, tc := range []struct {
		typ  string
		want []string // in the error, besides the column and table
	}{
		{"text COLLATE ci", []string{"text", `nondeterministic ICU collation "ci"`, "deterministic collation"}},
		{"varchar(64) COLLATE ci", []string{"character varying(64)", `collation "ci"`, "deterministic collation"}},
		{"character(5) COLLATE ci", []string{"character(5)", `collation "ci"`, `TYPE character(5) COLLATE "default"`}},
		{"ci_text", []string{"ci_text, a domain over text", `collation "ci"`}},
		{"money", []string{"money", "is not a type whose equality the guard knows", "citext, numeric"}},
		{"jsonb", []string{"jsonb", "is not a type"}},
		{"boolean", []string{"boolean", "is not a type"}},
		{"int4range", []string{"int4range", "is not a type"}},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			table := "refused_" + strings.Fields(strings.NewReplacer("(", "_", ")", "_", ",", "_").Replace(tc.typ))[0]
			execAll(t, dsn, `CREATE TABLE `+table+` (k `+tc.typ+` PRIMARY KEY)`)
			want := append([]string{`key column "k" of table ` + strings.Split(dsn, "search_path=")[1] + "." + table}, tc.want...)
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, ErrKeyType) {
					t.Fatalf("%s = %v, want ErrKeyType", what, err)
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %q does not say %q", what, err, w)
					}
				}
			}
			err := Publish(ctx, db, table, "k")
			t.Logf("Publish: %v", err)
			check("Publish", err)
			check("Install", Install(ctx, db, table, "k"))
			_, err = NewFollower(emptyLoaderOf[string](t), dsn, table, "k", parseText)
			check("NewFollower", err)
			_, err = newSource(dsn, "refused", []follow.Table{{Table: "users_none", Key: "id"}, {Table: table, Key: "k"}})
			check("newSource", err)
			_, _, err = ReadTable(ctx, connect(t, dsn), table, "k", func(string) error { return nil })
			check("ReadTable", err)
		})
	}
}

// TestKeyTypeRefusedAtRun: a follower that could not reach the database
// when it was made learns the type at its first session, and Run returns
// the refusal at once; Key says until then that it does not know.
func TestKeyTypeRefusedAtRun(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn, `CREATE TABLE refused (k money PRIMARY KEY)`,
		// By hand: Publish would refuse it.
		`CREATE PUBLICATION `+pgx.Identifier{publicationName(strings.Split(dsn, "search_path=")[1], "refused")}.Sanitize()+` FOR TABLE refused (k)`)
	p, via := viaProxy(t, dsn)
	target := p.Addr()
	p.SetTarget("127.0.0.1:1") // nothing listens
	f, err := NewFollower(emptyLoaderOf[string](t), via, "refused", "k", parseText, WithHeartbeat(50*time.Millisecond))
	if err != nil {
		t.Fatalf("NewFollower without a database = %v, want no error: the type is read at Run", err)
	}
	if _, err := f.Key("$1.00"); !errors.Is(err, ErrKeyUnknown) {
		t.Fatalf("Key before the type is known = %v, want ErrKeyUnknown", err)
	}
	u, _ := strings.CutPrefix(dsn, "postgres://")
	p.SetTarget(strings.Split(strings.SplitN(u, "@", 2)[1], "/")[0])
	_ = target
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := f.Run(rctx); !errors.Is(err, ErrKeyType) {
		t.Fatalf("Run = %v, want ErrKeyType at its first session", err)
	}
}

// TestKeyTypeCitextUnderICUDatabase: citext compares lower() under the
// database's default collation; under ICU that depends on the letters
// around each one, and the follower refuses citext there. A text key of
// the same database is taken.
func TestKeyTypeCitextUnderICUDatabase(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	name := fmt.Sprintf("cg_icu_%d", time.Now().UnixNano()%1e9)
	if _, err := db.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE template0 ENCODING 'UTF8' LOCALE_PROVIDER icu ICU_LOCALE 'und'`); err != nil {
		t.Skipf("no ICU database on this server: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, db.Config().ConnString())
		if err != nil {
			return
		}
		defer c.Close(ctx)
		c.Exec(ctx, `DROP DATABASE `+name+` WITH (FORCE)`)
	})
	cfg := db.Config().Copy()
	cfg.Database = name
	delete(cfg.RuntimeParams, "search_path")
	icu, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer icu.Close(ctx)
	ensureCitext(t, icu)
	execAll(t, fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name),
		`CREATE TABLE emails (k citext PRIMARY KEY)`, `CREATE TABLE names (k text PRIMARY KEY)`)
	err = Publish(ctx, icu, "emails", "k")
	t.Logf("Publish of citext under ICU: %v", err)
	if !errors.Is(err, ErrKeyType) || !strings.Contains(err.Error(), `ICU locale "und"`) || !strings.Contains(err.Error(), "lower-cased in a text column") {
		t.Errorf("Publish = %v, want ErrKeyType naming the database's ICU locale and the fix", err)
	}
	if err := Publish(ctx, icu, "names", "k"); err != nil {
		t.Errorf("Publish of text under an ICU database default (deterministic) = %v", err)
	}
	Unpublish(ctx, icu, "names")
}

// TestKeyTypeOutputSettingsInDSN: a DSN that sets a setting the follower
// would otherwise pin, to a form it does not read, is refused for the
// types it shapes.
func TestKeyTypeOutputSettingsInDSN(t *testing.T) {
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn, `CREATE TABLE stamps (k timestamptz PRIMARY KEY)`, `CREATE TABLE floats (k float8 PRIMARY KEY)`, `CREATE TABLE ids (k bigint PRIMARY KEY)`)
	for _, tc := range []struct{ table, params, want string }{
		{"stamps", "&DateStyle=SQL,DMY", "DateStyle"},
		{"floats", "&extra_float_digits=0", "extra_float_digits"},
	} {
		_, err := NewFollower(emptyLoaderOf[string](t), dsn+tc.params, tc.table, "k", parseText)
		if !errors.Is(err, ErrKeyType) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "remove the setting from the DSN") {
			t.Errorf("NewFollower of %s with %s = %v, want ErrKeyType naming %s", tc.table, tc.params, err, tc.want)
		}
	}
	if _, err := NewFollower(emptyLoaderOf[string](t), dsn+"&DateStyle=SQL,DMY", "ids", "k", parseText); err != nil {
		t.Errorf("NewFollower of a bigint key with DateStyle set = %v, want no error", err)
	}
}

// TestKeyTypeEnumRenamed: a label renamed (ALTER TYPE … RENAME VALUE) is
// another text for the same rows' keys, and no change in the stream: the
// publication's version changes, the follower reads the table again, and
// the new label reads present.
func TestKeyTypeEnumRenamed(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn, `CREATE TYPE mood AS ENUM ('happy', 'sad')`, `CREATE TABLE moods (k mood PRIMARY KEY)`, `INSERT INTO moods VALUES ('happy'), ('sad')`)
	if err := Publish(ctx, db, "moods", "k"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "moods.guard")
	conf := nodeConf{opts: []Option{WithSnapshotFile(file), WithSnapshotInterval(10 * time.Millisecond)}}
	a := startNode(t, dsn, "moods", "k", "A", parseText, conf)
	execAll(t, dsn, `ALTER TYPE mood RENAME VALUE 'happy' TO 'joyful'`)
	time.Sleep(3 * bound) // the next heartbeat finds the new version
	expectNoWrong404s(t, a, "after a label was renamed")
	if st := a.follower.Stats(); st.FullReads[ReadPublication] == 0 {
		t.Errorf("no read for the changed version: %v", st.FullReads)
	}
	a.halt()
	execAll(t, dsn, `ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'`)
	b := startNode(t, dsn, "moods", "k", "A", parseText, conf)
	expectNoWrong404s(t, b, "restarted after a label was renamed")
	if st := b.follower.Stats(); st.SnapshotStart != 0 || st.FullReads[ReadPublication] != 1 {
		t.Errorf("the restart used the file saved before the rename: %+v", st.FullReads)
	}
}
