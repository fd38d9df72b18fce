package fanout

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
	"github.com/cuckooguard/cuckooguard/mysql"
	"github.com/go-mysql-org/go-mysql/client"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// myServer is a MariaDB server as the switch test reaches it directly.
type myServer struct{ addr, user, pass string }

func (s myServer) conn(t *testing.T, db string) *client.Conn {
	t.Helper()
	c, err := client.ConnectWithTimeout(s.addr, s.user, s.pass, db, 10*time.Second)
	if err != nil {
		t.Fatalf("connect to %s: %v", s.addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// gtidPos returns the server's @@gtid_binlog_pos.
func (s myServer) gtidPos(t *testing.T) string {
	t.Helper()
	r, err := s.conn(t, "").Execute("SELECT @@GLOBAL.gtid_binlog_pos")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := r.GetString(0, 0)
	return p
}

// secondMyServer starts another MariaDB server with serverID
// (../mysql/testdata/mariadb2.sh, as .ci/run starts the first); it stops,
// and its data dir is removed, when the test ends. Without mariadbd the
// test skips, except under CI=true.
func secondMyServer(t *testing.T, serverID int) myServer {
	t.Helper()
	script, err := filepath.Abs("../mysql/testdata/mariadb2.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "cg-mariadb2-") // not t.TempDir: the mysql user must reach it
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", script, "start", dir, fmt.Sprint(serverID)).Output()
	if err != nil {
		os.RemoveAll(dir)
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 77 && os.Getenv("CI") != "true" {
			t.Skipf("no second MariaDB server: %s", ee.Stderr)
		}
		t.Fatalf("start a second MariaDB server: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("sh", script, "stop", dir).CombinedOutput(); err != nil {
			t.Errorf("stop the second server: %v: %s", err, out)
		}
	})
	return myServer{addr: "127.0.0.1:" + strings.TrimSpace(string(out)), user: "root"}
}

// mainMyServer returns CUCKOOGUARD_MYSQL_DSN's server and
// CUCKOOGUARD_NATS_URL; without them the test skips, except under
// CI=true.
func mainMyServer(t *testing.T) (myServer, string) {
	t.Helper()
	dsn, url := os.Getenv("CUCKOOGUARD_MYSQL_DSN"), os.Getenv("CUCKOOGUARD_NATS_URL")
	if dsn == "" || url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and CUCKOOGUARD_MYSQL_DSN or CUCKOOGUARD_NATS_URL is unset: .ci/run starts MariaDB and nats-server and sets them")
		}
		t.Skip("set CUCKOOGUARD_MYSQL_DSN and CUCKOOGUARD_NATS_URL to run (.ci/run starts both)")
	}
	// user[:password]@tcp(host:port)/db
	at := strings.LastIndex(dsn, "@")
	var s myServer
	s.user, s.pass, _ = strings.Cut(dsn[:at], ":")
	rest := dsn[at+1:]
	s.addr = strings.TrimSuffix(strings.TrimPrefix(rest[:strings.Index(rest, "/")], "tcp("), ")")
	return s, url
}

// ownMyDatabase creates database dbn on s, left out of its binlog (a
// replica started after it creates its own); it is dropped when the test
// ends.
func ownMyDatabase(t *testing.T, s myServer, dbn string) {
	t.Helper()
	myExec(t, s.conn(t, ""), "SET SESSION sql_log_bin = 0", "CREATE DATABASE `"+dbn+"`", "SET GLOBAL binlog_row_metadata = 'FULL'")
	t.Cleanup(func() {
		if c, err := client.Connect(s.addr, s.user, s.pass, ""); err == nil {
			c.Execute("DROP DATABASE IF EXISTS `" + dbn + "`")
			c.Close()
		}
	})
}

// proxiedEnv is a myEnv whose DSN (the relay's and the followers') reaches
// database dbn of primary through a TCP proxy, as through a virtual IP
// that a test can move; its table has 5000 rows. The test's own
// connections (e.addr) go to the server directly.
func proxiedEnv(t *testing.T, primary myServer, dbn, url, id string) (*myEnv, *tcpproxy.Proxy) {
	t.Helper()
	p, err := tcpproxy.Start(primary.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cred := primary.user
	if primary.pass != "" {
		cred += ":" + primary.pass
	}
	e := &myEnv{dsn: cred + "@tcp(" + p.Addr() + ")/" + dbn, addr: primary.addr, user: primary.user, pass: primary.pass, dbn: dbn,
		table: "cg_fo_" + id, relay: "my-" + id}
	myExec(t, e.conn(t), "CREATE TABLE `"+e.table+"` (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(32) NOT NULL) ENGINE=InnoDB",
		"INSERT INTO `"+e.table+"` (id, name) SELECT seq, 'seed' FROM seq_1_to_5000")
	if e.db, err = mysql.Relayed(e.dsn); err != nil {
		t.Fatal(err)
	}
	if e.nc, err = nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	e.opts = []Option{WithStream("CG_" + id), WithSubjectPrefix("cg" + id)}
	t.Cleanup(func() {
		ctx := context.Background()
		if js, err := jetstream.New(e.nc); err == nil {
			js.DeleteStream(ctx, "CG_"+id)
		}
		e.nc.Close()
		e.db.Teardown(ctx, e.relay, []string{e.table})
	})
	return e, p
}

// TestMySQLSwitchToReplica follows a table through a relay and two
// relayed followers while another client writes; the relay and the
// followers' sessions reach the primary through a TCP proxy (the DSN's
// address, as a virtual IP). The source is then switched to a GTID
// replica (a second server, server_id 2): writes stop, the replica catches
// up and is promoted, the proxy moves to it, and writes go on there. Both
// followers must follow again, with every key of both eras present and
// the deleted ones absent once applied. The replica has another
// server_id: the relay does not resume from its saved place there (it
// starts at the binlog's end, a reset), and its Origin is another, so
// the followers read the table again.
func TestMySQLSwitchToReplica(t *testing.T) {
	primary, url := mainMyServer(t)
	replica := secondMyServer(t, 2)

	// A database of the test's own on both servers, left out of the
	// primary's binlog: the replica replicates it, and only it (other
	// tests write other databases of the server meanwhile), from here on.
	id := fmt.Sprint(rand.Uint32())
	dbn := "cg_fosw_" + id
	ownMyDatabase(t, primary, dbn)
	host, port, _ := strings.Cut(primary.addr, ":")
	myExec(t, replica.conn(t, ""), "CREATE DATABASE `"+dbn+"`",
		"SET GLOBAL gtid_slave_pos = '"+primary.gtidPos(t)+"'",
		"SET GLOBAL replicate_do_db = '"+dbn+"'",
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '%s', MASTER_PORT = %s, MASTER_USER = '%s', MASTER_PASSWORD = '%s', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
			host, port, primary.user, primary.pass),
		"START SLAVE")
	e, p := proxiedEnv(t, primary, dbn, url, id)
	relay, _ := e.startRelay(t)
	waitLeading(t, relay)
	a, b := e.startNode(t, "a"), e.startNode(t, "b")
	w := e.startWriter(t, 1_000_000)
	time.Sleep(500 * time.Millisecond) // writes under way
	e.check(t, "on the primary, writer running", a, b)
	w.halt()
	era1 := w.commits.Load()

	// The switch: writes stopped, the replica caught up and promoted, the
	// address moved, writes on the new primary.
	pos := primary.gtidPos(t)
	rc := replica.conn(t, dbn)
	r, err := rc.Execute("SELECT MASTER_GTID_WAIT('" + pos + "', 60)")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := r.GetInt(0, 0); v != 0 {
		t.Fatalf("the replica never reached %s", pos)
	}
	myExec(t, rc, "STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL replicate_do_db = ''", "SET GLOBAL read_only = OFF")
	before := map[string]Stats{"a": a.f.Stats(), "b": b.f.Stats()}
	relayBefore := relay.Stats()
	p.SetTarget(replica.addr)
	p.CloseConns()
	switched := time.Now()
	e.addr = replica.addr
	a.conn, b.conn = e.conn(t), e.conn(t)
	w = e.startWriter(t, 2_000_000)
	for _, n := range []*myNode{a, b} {
		waitCurrent(t, n.id, n.f, n.loader)
		st := n.f.Stats()
		t.Logf("%s: following %v after the switch; reads %v→%v, failures %v→%v, last error %v",
			n.id, time.Since(switched), before[n.id].Reads, st.Reads, before[n.id].Failures, st.Failures, st.LastError)
	}
	rs := relay.Stats()
	t.Logf("relay: resets %d→%d, sessions %d→%d, last error %v", relayBefore.Resets, rs.Resets,
		relayBefore.Source.Sessions, rs.Source.Sessions, rs.Source.LastError)
	time.Sleep(500 * time.Millisecond) // writes under way on the new primary
	e.check(t, "on the new primary, writer running", a, b)
	w.halt()
	e.check(t, "on the new primary, writes stopped", a, b)

	// Deleted keys read absent once applied: every id the writers could
	// have written and the table does not hold.
	present := map[int64]bool{}
	r, err = a.conn.Execute("SELECT id FROM `" + e.table + "`")
	if err != nil {
		t.Fatal(err)
	}
	var hi [2]int64
	for i := range r.RowNumber() {
		v, _ := r.GetInt(i, 0)
		present[v] = true
		if k := v / 1_000_000; k == 1 || k == 2 {
			hi[k-1] = max(hi[k-1], v)
		}
	}
	for _, n := range []*myNode{a, b} {
		waitCurrent(t, n.id, n.f, n.loader)
		waitCurrent(t, n.id, n.f, n.loader) // a delete waits for a heartbeat after it
		absent, rejected := 0, 0
		for k, top := range hi {
			for v := int64(k+1) * 1_000_000; v <= top; v++ {
				if !present[v] {
					absent++
					if !n.loader.MayContain(v) {
						rejected++
					}
				}
			}
		}
		t.Logf("%s: %d of %d absent ids of the writer's read absent", n.id, rejected, absent)
		if absent > 0 && rejected == 0 {
			t.Errorf("%s: no absent id reads absent (%d absent)", n.id, absent)
		}
	}
	t.Logf("writer commits: %d before the switch, %d after", era1, w.commits.Load())
}

// TestMySQLSwitchToUnrelated moves the address of a relay and its two
// followers to a server that is not a replica of the one they followed
// (a second server, server_id 2, after RESET MASTER): the same database
// and table names, other rows. The followers must not keep the guard of
// the server left: they read the new server's table (another Origin),
// whose every key then reads present, and the old keys read absent.
func TestMySQLSwitchToUnrelated(t *testing.T) {
	first, url := mainMyServer(t)
	other := secondMyServer(t, 2)
	id := fmt.Sprint(rand.Uint32())
	dbn := "cg_fosw_" + id
	ownMyDatabase(t, first, dbn)
	e, p := proxiedEnv(t, first, dbn, url, id)
	oc := other.conn(t, "")
	myExec(t, oc, "RESET MASTER", "CREATE DATABASE `"+dbn+"`", "USE `"+dbn+"`",
		"CREATE TABLE `"+e.table+"` (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(32) NOT NULL) ENGINE=InnoDB",
		"INSERT INTO `"+e.table+"` (id, name) SELECT seq + 3000000, 'other' FROM seq_1_to_4000")

	relay, _ := e.startRelay(t)
	waitLeading(t, relay)
	a, b := e.startNode(t, "a"), e.startNode(t, "b")
	w := e.startWriter(t, 1_000_000)
	time.Sleep(500 * time.Millisecond)
	w.halt()
	e.check(t, "on the first server", a, b)
	r, err := a.conn.Execute("SELECT id FROM `" + e.table + "`")
	if err != nil {
		t.Fatal(err)
	}
	old := make([]int64, r.RowNumber())
	for i := range old {
		old[i], _ = r.GetInt(i, 0)
	}

	before := map[string]Stats{"a": a.f.Stats(), "b": b.f.Stats()}
	p.SetTarget(other.addr)
	p.CloseConns()
	switched := time.Now()
	e.addr = other.addr
	a.conn, b.conn = e.conn(t), e.conn(t)
	for _, n := range []*myNode{a, b} {
		waitCurrent(t, n.id, n.f, n.loader)
		st := n.f.Stats()
		t.Logf("%s: following %v after the switch; reads %v→%v, failures %v→%v, last error %v",
			n.id, time.Since(switched), before[n.id].Reads, st.Reads, before[n.id].Failures, st.Failures, st.LastError)
		if total(st.Reads) == total(before[n.id].Reads) {
			t.Errorf("%s: no read of the unrelated server's table: reads %v", n.id, st.Reads)
		}
	}
	e.check(t, "the unrelated server's table", a, b)
	for _, n := range []*myNode{a, b} {
		kept := 0
		for _, v := range old {
			if n.loader.MayContain(v) {
				kept++
			}
		}
		t.Logf("%s: %d of the %d keys of the server left still read present", n.id, kept, len(old))
		if kept > len(old)/10 {
			t.Errorf("%s: %d of the %d keys of the server left still read present: the old guard was kept", n.id, kept, len(old))
		}
	}
}

func total(m map[string]int64) (n int64) {
	for _, v := range m {
		n += v
	}
	return n
}
