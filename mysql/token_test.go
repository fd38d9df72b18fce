package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
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

// TestPositionsWaitForDeletions drives the positions a Follower reports
// without a server: a transaction's position reaches the Loader once the
// deletions held before and in it are released, not before, and in
// order.
func TestPositionsWaitForDeletions(t *testing.T) {
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
	f.reachAfter(101) // no deletion held
	f.holds.hold([]int64{1, 2})
	f.reachAfter(102) // two deletions held
	f.reachAfter(103) // behind the same two
	f.holds.hold([]int64{3})
	f.reachAfter(104) // behind three
	if got := at(); got != 101 {
		t.Fatalf("with deletions held: position %d, want 101", got)
	}
	release := func(n int) {
		clear(f.holds.held[:n])
		f.holds.held = f.holds.held[n:]
		f.releasedHeld(n)
	}
	release(1)
	if got := at(); got != 101 {
		t.Fatalf("one of two deletions released: position %d, want 101", got)
	}
	release(1)
	if got := at(); got != 103 {
		t.Fatalf("two released: position %d, want 103", got)
	}
	f.holds.hold([]int64{5})
	f.reachAfter(105)
	release(2)
	if got := at(); got != 105 || len(f.holds.after) != 0 {
		t.Fatalf("all released: position %d, %d waiting; want 105, 0", got, len(f.holds.after))
	}
	f.holds.hold([]int64{6})
	f.reachAfter(106)
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
		if tc.wrong <= 5 {
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
