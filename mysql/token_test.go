package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-mysql-org/go-mysql/driver" // database/sql's "mysql", for WriteToken's callers

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

func TestTokenOf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pos    string
		strict bool
		want   string // the token's text; "" for an error
		noTok  bool   // the error wraps ErrNoToken
	}{
		{name: "one domain", pos: "0-1-41", strict: true, want: "mariadb-7-0.29"},
		{name: "another domain", pos: "3-2-16", strict: true, want: "mariadb-7-3.10"},
		{name: "empty binlog", pos: "", strict: true, want: "mariadb-7-2.0"},
		{name: "not strict", pos: "0-1-41", noTok: true},
		{name: "two domains", pos: "0-1-41,3-1-2", strict: true, noTok: true},
		{name: "damaged", pos: "0-1", strict: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := tokenOf(7, 2, tc.pos, tc.strict)
			switch {
			case tc.want != "" && (err != nil || tok.String() != tc.want):
				t.Fatalf("tokenOf(%q) = %v, %v; want %s", tc.pos, tok, err, tc.want)
			case tc.want == "" && err == nil:
				t.Fatalf("tokenOf(%q) = %v, want an error", tc.pos, tok)
			case errors.Is(err, ErrNoToken) != tc.noTok:
				t.Fatalf("tokenOf(%q) = %v; want ErrNoToken: %v", tc.pos, err, tc.noTok)
			}
		})
	}
}

// TestPositionsReachedAtCommit drives the positions a Follower reports
// without a server: a transaction's position reaches the Loader at its
// commit, deletions held for visibility or not (they keep their keys in
// the guard: a false positive), and a read reports where it read.
func TestPositionsReachedAtCommit(t *testing.T) {
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, string](func(context.Context, int64) (string, error) { return "", guarded.ErrNotFound }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := NewFollower[int64](l, "u@tcp(127.0.0.1:1)/db", "t", "id", parseInt64)
	if err != nil {
		t.Fatal(err)
	}
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Detach()
	f.feed = feed
	at := func() uint64 { return l.Position().Pos() }
	f.startPositions(9, 0, gtidPos{0: {0, 9, 100}, 4: {4, 9, 7}})
	if p := l.Position(); p.String() != "mariadb-9-0.64" {
		t.Fatalf("after the start: position %v, want mariadb-9-0.64", p)
	}
	f.reachAfter(101)
	f.holds.hold([]int64{1, 2})
	f.reachAfter(102) // two deletions held
	if got := at(); got != 102 {
		t.Fatalf("with deletions held: position %d, want 102", got)
	}
	f.holds.hold([]int64{3})
	f.reachAfter(104)
	if got := at(); got != 104 {
		t.Fatalf("with three deletions held: position %d, want 104", got)
	}
	f.holds.drop() // a read of the table
	f.startPositions(9, 0, gtidPos{0: {0, 9, 90}})
	if got := at(); got != 90 {
		t.Fatalf("after a read at 90: position %d, want 90 (a read reports where it read, earlier or not)", got)
	}
	f.startPositions(10, 0, gtidPos{0: {0, 10, 5}})
	if p := l.Position(); p.String() != "mariadb-10-0.5" {
		t.Fatalf("on another server: position %v, want mariadb-10-0.5", p)
	}
}

// strictGTID turns gtid_strict_mode on for the test (WriteToken needs
// it), and back to what it was when the test ends.
func strictGTID(t *testing.T, srv server) {
	t.Helper()
	c := connect(t, srv)
	r, err := c.Execute("SELECT @@GLOBAL.gtid_strict_mode")
	if err != nil {
		t.Fatal(err)
	}
	was, _ := r.GetInt(0, 0)
	exec(t, c, "SET GLOBAL gtid_strict_mode = ON")
	t.Cleanup(func() { exec(t, connect(t, srv), fmt.Sprintf("SET GLOBAL gtid_strict_mode = %d", was)) })
}

// openDB opens srv through database/sql (go-mysql's driver), as a writer
// of the application would; closed when the test ends.
func openDB(t *testing.T, srv server) *sql.DB {
	t.Helper()
	cred := srv.user
	if srv.password != "" {
		cred += ":" + srv.password
	}
	db, err := sql.Open("mysql", fmt.Sprintf("%s@%s/%s", cred, srv.addr(), srv.db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// startTokenNode is startNode with Loader options (the token wait).
func startTokenNode(t *testing.T, srv server, table string, lopts []guarded.Option, opts ...Option) *node[int64] {
	t.Helper()
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	store := guarded.GetterFunc[int64, string](func(ctx context.Context, k int64) (string, error) {
		return "", guarded.ErrNotFound // MayContainContext alone is checked
	})
	l, err := guarded.New(g, store, lopts...)
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFollower[int64](l, dsnOf(srv), table, "id", parseInt64, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node[int64]{srv: srv, table: table, key: "id", loader: l, follower: f, conn: connect(t, srv), cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- f.Run(ctx) }()
	t.Cleanup(func() { n.halt(t) })
	return n
}

// TestWriteToken checks what WriteToken reads from the server, through
// database/sql and go-mysql's client alike, and what it refuses.
func TestWriteToken(t *testing.T) {
	srv := testDSN(t)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY", "")
	db := openDB(t, srv)
	ctx := context.Background()
	exec(t, c, "SET GLOBAL gtid_strict_mode = OFF")
	strictGTID(t, srv)
	exec(t, c, "SET GLOBAL gtid_strict_mode = OFF")
	if _, err := WriteToken(ctx, db); !errors.Is(err, ErrNoToken) || !strings.Contains(err.Error(), "gtid_strict_mode") {
		t.Fatalf("WriteToken with gtid_strict_mode OFF = %v, want ErrNoToken naming gtid_strict_mode", err)
	}
	exec(t, c, "SET GLOBAL gtid_strict_mode = ON")

	if _, err := db.ExecContext(ctx, "INSERT INTO `"+table+"` (id) VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	tok, err := WriteToken(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Execute("SELECT @@GLOBAL.server_id, @@GLOBAL.gtid_binlog_pos")
	if err != nil {
		t.Fatal(err)
	}
	id, _ := r.GetUint(0, 0)
	text, _ := r.GetString(0, 1)
	p, err := parseGTIDPos(text)
	if err != nil || len(p) != 1 {
		t.Fatalf("gtid_binlog_pos %q (%v): the test needs one domain", text, err)
	}
	for d, g := range p {
		if want := fmt.Sprintf("mariadb-%d-%d.%x", id, d, g.seq); tok.String() != want {
			t.Fatalf("WriteToken = %v, want %s", tok, want)
		}
	}
	if other, err := WriteTokenConn(c); err != nil || other != tok {
		t.Fatalf("WriteTokenConn = %v, %v; want %v", other, err, tok)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO `"+table+"` (id) VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	if tok, err := WriteToken(ctx, tx); err == nil || !strings.Contains(err.Error(), "transaction") {
		t.Fatalf("WriteToken inside a transaction = %v, %v; want an error", tok, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	after, err := WriteToken(ctx, db)
	if err != nil || after.Stream() != tok.Stream() || after.Pos() <= tok.Pos() {
		t.Fatalf("after a commit: WriteToken = %v, %v; want a later position than %v", after, err, tok)
	}
}

// tokenCheck looks key up in n's Loader under tok and counts the answer:
// absent under its own token is a wrong 404. Without the token, absent
// is counted as what the token prevents.
type tokenCheck struct {
	checked, wrong, without, waited, passed int
	// quiet: a wrong answer is counted, not an error (the window after
	// RESET MASTER that the package doc owns up to).
	quiet bool
}

func (tc *tokenCheck) check(t *testing.T, n *node[int64], key int64, tok guarded.Token) {
	t.Helper()
	before := n.loader.Stats()
	ready := n.loader.Ready()
	if ready && !n.loader.MayContain(key) {
		tc.without++
	}
	tc.checked++
	if !n.loader.MayContainContext(guarded.WithToken(context.Background(), tok), key) {
		tc.wrong++
		if !tc.quiet && tc.wrong <= 5 {
			t.Errorf("key %d absent under its own token %v (Loader at %v, %v)", key, tok, n.loader.Position(), n.follower.Stats().State)
		}
	}
	after := n.loader.Stats()
	if after.TokenWaits > before.TokenWaits {
		tc.waited++
	}
	if after.TokenPassed > before.TokenPassed {
		tc.passed++
	}
}

// TestReadYourWrites: a writer of no replica's (database/sql) inserts a
// key and takes its token, and the key is at once looked up on a
// follower's Loader under it: present every time, while the follower
// keeps up, and while its stream is delayed (its lease held by a long
// max lag, so that its guard answers absent without the token: the
// lookup must wait and pass through).
func TestReadYourWrites(t *testing.T) {
	srv := testDSN(t)
	strictGTID(t, srv)
	table, _ := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY", "")
	db := openDB(t, srv)
	route, via := newRoute(t, srv)
	n := startTokenNode(t, via, table, []guarded.Option{guarded.WithTokenWait(20 * time.Millisecond)},
		WithMaxLag(5*time.Second), WithHeartbeatDeadline(5*time.Second))
	n.waitCurrent(t)
	ctx := context.Background()
	id := int64(0)
	run := func(name string, count int) tokenCheck {
		var tc tokenCheck
		for range count {
			id++
			if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, id)); err != nil {
				t.Fatal(err)
			}
			tok, err := WriteToken(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, n, id, tok)
		}
		t.Logf("%s: %d keys checked under their token, %d absent (wrong 404s); %d would have read absent without it; %d waited, %d passed through after the wait",
			name, tc.checked, tc.wrong, tc.without, tc.waited, tc.passed)
		return tc
	}
	run("keeping up", 500)
	route.p.SetDelay(200 * time.Millisecond)
	time.Sleep(300 * time.Millisecond) // the delay reaches the bytes in flight
	if st := n.follower.Stats(); st.State != Following {
		t.Fatalf("delayed stream: state %v (%v), want following under the long max lag", st.State, st.LastError)
	}
	slow := run("stream delayed 200 ms", 100)
	route.p.SetDelay(0)
	if slow.without == 0 || slow.passed == 0 {
		t.Fatalf("delayed stream: %d keys absent without the token, %d passed through: the delay did not hold the follower back", slow.without, slow.passed)
	}
	n.waitCurrent(t)
	run("caught up again", 100)
}

// TestTokenOtherHistory: lookups under a token of another stream (a
// made-up server or domain, a second GTID domain) pass through, and so do
// those of another history of the same server: after RESET MASTER the
// sequence numbers start again at 1, below the follower's position, and
// every key written and looked up under its token from the moment the
// reset returns must read present until the follower has read the new
// history (and after). A token of the old history, beyond the new one's
// positions, waits and passes through.
func TestTokenOtherHistory(t *testing.T) {
	srv := testDSN(t)
	strictGTID(t, srv)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY", "")
	db := openDB(t, srv)
	n := startTokenNode(t, srv, table, []guarded.Option{guarded.WithTokenWait(20 * time.Millisecond)}, WithBackoff(20*time.Millisecond))
	ctx := context.Background()
	id := int64(0)
	var tc tokenCheck
	write := func() (int64, guarded.Token) {
		t.Helper()
		id++
		if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, id)); err != nil {
			t.Fatal(err)
		}
		tok, err := WriteToken(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		return id, tok
	}
	// The old history: far enough that the new one's first positions are
	// below the follower's.
	insertRange(t, c, table, 1_000_000, 1_000_100)
	for range 200 {
		k, tok := write()
		tc.check(t, n, k, tok)
	}
	n.waitApplied(t)
	old := n.loader.Position()
	absentKey := int64(-1)
	passes := func(name string, tok guarded.Token) {
		t.Helper()
		before := n.loader.Stats()
		if !n.loader.MayContainContext(guarded.WithToken(ctx, tok), absentKey) {
			t.Fatalf("%s: a key of no row reads absent under token %v (Loader at %v): the token was judged reached", name, tok, n.loader.Position())
		}
		after := n.loader.Stats()
		t.Logf("%s (%v, Loader at %v): passed through (%d foreign, %d after the wait)", name, tok, n.loader.Position(),
			after.TokenForeign-before.TokenForeign, after.TokenPassed-before.TokenPassed)
	}
	if n.loader.MayContain(absentKey) {
		t.Fatalf("key %d: the guard does not reject it, the checks below could not fail", absentKey)
	}
	server, _ := strings.CutPrefix(old.Stream(), "mariadb-")
	server, _, _ = strings.Cut(server, "-")
	for _, name := range []string{"mariadb-4000000000-0", "mariadb-" + server + "-9", "elsewhere"} {
		tok, err := guarded.NewToken(name, 1)
		if err != nil {
			t.Fatal(err)
		}
		passes("made-up stream "+name, tok)
	}

	// A second GTID domain: no token is given, and the follower's
	// positions stay those of its own domain.
	exec(t, c, "SET SESSION gtid_domain_id = 9", fmt.Sprintf("INSERT INTO `%s` (id) VALUES (2000000)", table), "SET SESSION gtid_domain_id = DEFAULT")
	if tok, err := WriteToken(ctx, db); !errors.Is(err, ErrNoToken) {
		t.Fatalf("WriteToken with two GTID domains = %v, %v; want ErrNoToken", tok, err)
	}
	n.waitCurrent(t)
	if p := n.loader.Position(); p.Stream() != old.Stream() || p.Pos() < old.Pos() {
		t.Fatalf("after a transaction of domain 9: Loader at %v, want %s at or past %v", p, old.Stream(), old)
	}
	passes("domain 9's position", mustToken(t, "mariadb-"+server+"-9", 1))

	// Another history: RESET MASTER under the follower.
	reads := n.follower.Stats().FullReads
	began := time.Now()
	exec(t, c, "RESET MASTER")
	reset := time.Now()
	st := n.follower.Stats()
	r, err := c.Execute("SELECT @@GLOBAL.gtid_binlog_pos")
	if err != nil {
		t.Fatal(err)
	}
	now, _ := r.GetString(0, 0)
	t.Logf("RESET MASTER took %v; then: follower %v, Loader ready %v, at %v; the binlog at %q", reset.Sub(began).Round(time.Millisecond), st.State, n.loader.Ready(), n.loader.Position(), now)
	// Until the Loader's lease runs out (the max lag after the last
	// heartbeat back, sent before the reset returned) it is ready, and a
	// token of the new history below its position is judged reached: the
	// package doc says so ("do not RESET MASTER a followed server"). Those
	// lookups are counted; every one after must be right.
	window := tokenCheck{quiet: true}
	windowEnd := reset.Add(DefaultMaxLag + 10*time.Millisecond)
	var during tokenCheck
	below := 0 // keys written at positions the follower had passed in the old history
	for n.follower.Stats().FullReads == reads || !n.loader.Ready() {
		if time.Since(reset) > time.Minute {
			t.Fatalf("the follower did not read the new history in a minute: %+v", n.follower.Stats())
		}
		k, tok := write()
		if tok.Pos() <= old.Pos() {
			below++
		} else if below == 0 {
			t.Fatalf("the new history's first write is at %v, past the old one's %v: the case needs it below", tok, old)
		}
		if time.Now().Before(windowEnd) {
			window.check(t, n, k, tok)
		} else {
			during.check(t, n, k, tok)
		}
	}
	n.waitCurrent(t)
	t.Logf("within the max lag after RESET MASTER: %d keys checked under their token, %d absent (the window the package doc owns up to)", window.checked, window.wrong)
	st = n.follower.Stats()
	t.Logf("after RESET MASTER, until the follower read the new history (%v): %d keys checked under their token (%d at positions below the follower's in the old history), %d absent (wrong 404s), %d would have read absent without it; the session ended with %v; read because %q",
		time.Since(reset).Round(time.Millisecond), during.checked, below, during.wrong, during.without, st.LastError, st.ReadReason)
	if p := n.loader.Position(); p.Pos() < old.Pos() {
		passes("a token of the old history past the new one's position", old)
	} else {
		// The new history's read holds every write of the old one: a
		// token the new history has passed is reached, rightly.
		t.Logf("the new history (at %v) passed the old one's token %v: it is reached", p, old)
	}
	for range 200 {
		k, tok := write()
		tc.check(t, n, k, tok)
	}
	t.Logf("before and after: %d keys checked under their token, %d absent (wrong 404s); %d would have read absent without it; %d waited, %d passed through",
		tc.checked, tc.wrong, tc.without, tc.waited, tc.passed)
	if window.checked+during.checked == 0 { // the follower may read the new history within the window
		t.Fatal("no key was checked between the reset and the read")
	}
}

func mustToken(t testing.TB, stream string, pos uint64) guarded.Token {
	t.Helper()
	tok, err := guarded.NewToken(stream, pos)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestTokenModel: four writers (database/sql) insert, delete and change
// keys of their own at random, each write followed by its token, while
// the follower's stream is delayed now and then (its lease held by a long
// max lag); every key a writer created, and has not deleted since, must
// read present on the follower's Loader under the writer's latest token:
// the key just written, and every 50 writes all the writer's keys.
func TestTokenModel(t *testing.T) {
	srv := testDSN(t)
	strictGTID(t, srv)
	table, _ := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY", "")
	db := openDB(t, srv)
	route, via := newRoute(t, srv)
	n := startTokenNode(t, via, table, []guarded.Option{guarded.WithTokenWait(20 * time.Millisecond)},
		WithMaxLag(2*time.Second), WithHeartbeatDeadline(3*time.Second))
	n.waitCurrent(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	run := 3 * time.Second
	if testing.Short() {
		run = time.Second
	}
	ctx, stop := context.WithTimeout(context.Background(), run)
	defer stop()
	const writers, space = 4, 4000
	counts := make([]tokenCheck, writers)
	ops := make([]int, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			have := map[int64]bool{} // the writer's keys that have a row
			var tok guarded.Token
			pick := func(want bool) (int64, bool) {
				for range 20 {
					k := int64(r.IntN(space/writers)*writers + w)
					if have[k] == want {
						return k, true
					}
				}
				return 0, false
			}
			for ctx.Err() == nil {
				var q string
				var created int64 = -1
				switch op := r.IntN(10); {
				case op < 5:
					k, ok := pick(false)
					if !ok {
						continue
					}
					q, created = fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, k), k
					have[k] = true
				case op < 8:
					k, ok := pick(true)
					if !ok {
						continue
					}
					q = fmt.Sprintf("DELETE FROM `%s` WHERE id = %d", table, k)
					delete(have, k)
				default:
					from, ok1 := pick(true)
					to, ok2 := pick(false)
					if !ok1 || !ok2 {
						continue
					}
					q, created = fmt.Sprintf("UPDATE `%s` SET id = %d WHERE id = %d", table, to, from), to
					delete(have, from)
					have[to] = true
				}
				if _, err := db.ExecContext(context.Background(), q); err != nil {
					t.Errorf("%s: %v", q, err)
					return
				}
				next, err := WriteToken(context.Background(), db)
				if err != nil {
					t.Errorf("WriteToken: %v", err)
					return
				}
				tok = tok.Later(next)
				ops[w]++
				if created >= 0 {
					counts[w].check(t, n, created, tok)
				}
				if ops[w]%50 == 0 {
					for k := range have {
						counts[w].check(t, n, k, tok)
					}
				}
			}
		})
	}
	// The stream delayed now and then: 0, 50 or 150 ms.
	wg.Go(func() {
		r := rand.New(rand.NewPCG(seed, writers))
		delays := []time.Duration{0, 50 * time.Millisecond, 150 * time.Millisecond}
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				route.p.SetDelay(0)
				return
			case <-tick.C:
				route.p.SetDelay(delays[r.IntN(len(delays))])
			}
		}
	})
	wg.Wait()
	var all tokenCheck
	total := 0
	for w := range writers {
		c := counts[w]
		all.checked += c.checked
		all.wrong += c.wrong
		all.without += c.without
		all.waited += c.waited
		all.passed += c.passed
		total += ops[w]
	}
	st := n.follower.Stats()
	t.Logf("%d writes by %d writers in %v; %d keys checked under the writer's token, %d absent (wrong 404s); %d would have read absent without it; %d waited, %d passed through after the wait; follower %v, %d failures",
		total, writers, run, all.checked, all.wrong, all.without, all.waited, all.passed, st.State, st.Failures)
	if all.checked == 0 || all.without == 0 {
		t.Fatalf("%d keys checked, %d absent without the token: the case did not exercise the tokens", all.checked, all.without)
	}
}
