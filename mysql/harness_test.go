package mysql

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// node is one simulated replica: a Loader and the Follower that keeps it
// in step with a table.
type node[K comparable] struct {
	srv      server
	table    string
	key      string
	loader   *guarded.Loader[K, string]
	follower *Follower[K]
	conn     *client.Conn // for the checks
	cancel   context.CancelFunc
	done     chan error
	stopped  sync.Once
	runErr   error // what Run returned, once stopped
}

// halt stops n's Follower, as a process that exits does, and closes its
// Loader; Run must return context.Canceled. The test's end halts every
// node that is still running.
func (n *node[K]) halt(t *testing.T) {
	t.Helper()
	n.stopped.Do(func() {
		n.cancel()
		n.runErr = <-n.done
		n.loader.Close()
		if !errors.Is(n.runErr, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", n.runErr)
		}
	})
}

// dsnOf writes s as a DSN.
func dsnOf(s server) string {
	cred := s.user
	if s.password != "" {
		cred += ":" + s.password
	}
	return fmt.Sprintf("%s@tcp(%s)/%s", cred, s.addr(), s.db)
}

// startNode starts a Follower of table's key column into a fresh Loader;
// it stops when the test ends.
func startNode[K comparable](t *testing.T, srv server, table, key string, parse func(string) (K, error), opts ...Option) *node[K] {
	t.Helper()
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	store := guarded.GetterFunc[K, string](func(ctx context.Context, k K) (string, error) {
		return "", guarded.ErrNotFound // MayContain alone is checked
	})
	l, err := guarded.New(g, store)
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFollower[K](l, dsnOf(srv), table, key, parse, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node[K]{srv: srv, table: table, key: key, loader: l, follower: f, conn: connect(t, srv), cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- f.Run(ctx) }()
	t.Cleanup(func() { n.halt(t) })
	return n
}

// waitCurrent waits until n follows with every change committed before
// the call applied: a heartbeat written after it has come back.
func (n *node[K]) waitCurrent(t *testing.T) time.Duration {
	t.Helper()
	since := time.Now()
	deadline := since.Add(60 * time.Second)
	for {
		st := n.follower.Stats()
		if st.State == Following && n.loader.Ready() && st.CurrentAsOf.After(since) {
			return time.Since(since)
		}
		if time.Now().After(deadline) {
			t.Fatalf("never followed with the changes before %v: state %v, last error %v, full reads %d, failures %d",
				since.Format(time.StampMilli), st.State, st.LastError, st.FullReads, st.Failures)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitApplied waits until n has applied every change committed before
// the call, deletes included: a delete waits for a heartbeat written after
// it to return (visible.go), and the heartbeat after that one is written
// only once it has.
func (n *node[K]) waitApplied(t *testing.T) {
	t.Helper()
	n.waitCurrent(t)
	n.waitCurrent(t)
}

// keys returns the key column of every row, as the server gives it.
func (n *node[K]) keys(t *testing.T) []string {
	t.Helper()
	r, err := n.conn.Execute("SELECT `" + n.key + "` FROM `" + n.table + "`")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, r.RowNumber())
	for i := range out {
		out[i], _ = r.GetString(i, 0)
	}
	return out
}

// wrong404s reads every key of the table, waits until n is current with
// every change committed before the read, and checks each key through n's
// Loader: a key that a ready Loader reports absent while its row still
// exists (writers may delete rows meanwhile) is a wrong 404. It returns
// the keys checked and the wrong 404s, and logs the first few.
func (n *node[K]) wrong404s(t *testing.T, parse func(string) (K, error)) (checked, wrong int) {
	t.Helper()
	keys := n.keys(t)
	n.waitCurrent(t)
	for _, s := range keys {
		k, err := parse(s)
		if err != nil {
			t.Fatalf("parse(%q): %v", s, err)
		}
		checked++
		if n.loader.MayContain(k) || !n.loader.Ready() || !n.exists(t, s) {
			continue
		}
		wrong++
		if wrong <= 5 {
			t.Logf("wrong 404 for committed key %q (%v)", s, n.follower.Stats().State)
		}
	}
	return checked, wrong
}

// exists reports whether the table has a row whose key is text, by the
// server's own equality.
func (n *node[K]) exists(t *testing.T, text string) bool {
	t.Helper()
	r, err := n.conn.Execute("SELECT COUNT(*) FROM `"+n.table+"` WHERE `"+n.key+"` = ?", text)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := r.GetInt(0, 0)
	return c > 0
}

// parseInt64 is the parse function of an integer key.
func parseInt64(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

// parseString is the parse function of a text key.
func parseString(s string) (string, error) { return s, nil }

// newTable creates a table of the test's own with columns (SQL, such as
// "id BIGINT NOT NULL PRIMARY KEY") and options (after ENGINE=InnoDB), and
// returns its name and a connection; the table (and a rename's _old
// copy) is dropped when the test ends, after its followers stop.
func newTable(t *testing.T, srv server, columns, options string) (string, *client.Conn) {
	t.Helper()
	table := tableName(t)
	c := connect(t, srv)
	exec(t, c, "CREATE TABLE `"+table+"` ("+columns+") ENGINE=InnoDB "+options)
	t.Cleanup(func() {
		exec(t, connect(t, srv), "DROP TABLE IF EXISTS `"+table+"`", "DROP TABLE IF EXISTS `"+table+"_old`")
	})
	return table, c
}

// exec runs each statement on c, failing the test on an error.
func exec(t testing.TB, c *client.Conn, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := c.Execute(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// insertRange inserts the ids [from, to) into table in one transaction.
func insertRange(t testing.TB, c *client.Conn, table string, from, to int) {
	t.Helper()
	const batch = 1000
	exec(t, c, "BEGIN")
	for lo := from; lo < to; lo += batch {
		var b strings.Builder
		b.WriteString("INSERT INTO `" + table + "` (id) VALUES ")
		for i := lo; i < min(lo+batch, to); i++ {
			if i > lo {
				b.WriteByte(',')
			}
			b.WriteString("(" + strconv.Itoa(i) + ")")
		}
		exec(t, c, b.String())
	}
	exec(t, c, "COMMIT")
}

// isServerErr reports whether err is the server's answer (an error
// packet), not a broken connection.
func isServerErr(err error) bool {
	var me *gomysql.MyError
	return errors.As(err, &me)
}

// splitAddr splits host:port.
func splitAddr(t *testing.T, addr string) (string, uint16) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	return host, uint16(p)
}
