package mysql

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
)

// secondServer starts another MariaDB server with serverID
// (testdata/mariadb2.sh: a data dir of its own, a free port, a row-based
// binlog with GTIDs in strict mode and the replica's own updates in it)
// and returns it as root's, with database db (created on it); it stops,
// and its data dir is removed, when the test ends. Without mariadbd the
// test skips, except under CI=true.
func secondServer(t *testing.T, serverID int, db string) server {
	t.Helper()
	script, err := filepath.Abs("testdata/mariadb2.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "cg-mariadb2-") // not t.TempDir: the mysql user must reach it
	if err != nil {
		t.Fatal(err)
	}
	out, err := osexec.Command("sh", script, "start", dir, strconv.Itoa(serverID)).Output()
	if err != nil {
		os.RemoveAll(dir)
		var ee *osexec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 77 && os.Getenv("CI") != "true" {
			t.Skipf("no second MariaDB server: %s", ee.Stderr)
		}
		t.Fatalf("start a second MariaDB server: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := osexec.Command("sh", script, "stop", dir).CombinedOutput(); err != nil {
			t.Errorf("stop the second server: %v: %s", err, out)
		}
	})
	port, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 16)
	if err != nil {
		t.Fatalf("the second server's port %q: %v", out, err)
	}
	s := server{user: "root", host: "127.0.0.1", port: uint16(port), db: "mysql"}
	exec(t, connect(t, s), "CREATE DATABASE `"+db+"`")
	s.db = db
	return s
}

// ownDatabase creates a database of the test's own on srv, left out of
// srv's binlog (a replica started after it creates its own), and returns
// srv with it; it is dropped when the test ends.
func ownDatabase(t *testing.T, srv server) server {
	t.Helper()
	db := fmt.Sprintf("cg_switch_%d", rand.Uint32())
	exec(t, connect(t, srv), "SET SESSION sql_log_bin = 0", "CREATE DATABASE `"+db+"`")
	t.Cleanup(func() {
		if c, err := client.Connect(srv.addr(), srv.user, srv.password, ""); err == nil {
			c.Execute("DROP DATABASE IF EXISTS `" + db + "`")
			c.Close()
		}
	})
	srv.db = db
	return srv
}

// gtidBinlogPos returns the server's @@gtid_binlog_pos.
func gtidBinlogPos(t *testing.T, c *client.Conn) string {
	t.Helper()
	r, err := c.Execute("SELECT @@GLOBAL.gtid_binlog_pos")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := r.GetString(0, 0)
	return s
}

// startReplica makes replica a GTID replica of primary's database (the
// one both servers' db names), from primary's binlog as it is now: the
// database's transactions from here on, and only them (other tests write
// other databases of the server meanwhile).
func startReplica(t *testing.T, primary, replica server) {
	t.Helper()
	pos := gtidBinlogPos(t, connect(t, primary))
	exec(t, connect(t, replica),
		"SET GLOBAL gtid_slave_pos = '"+pos+"'",
		"SET GLOBAL replicate_do_db = '"+primary.db+"'",
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '%s', MASTER_PORT = %d, MASTER_USER = '%s', MASTER_PASSWORD = '%s', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
			primary.host, primary.port, primary.user, primary.password),
		"START SLAVE")
}

// catchUp waits until replica has applied every transaction primary's
// binlog holds now.
func catchUp(t *testing.T, primary, replica server) {
	t.Helper()
	pos := gtidBinlogPos(t, connect(t, primary))
	c := connect(t, replica)
	r, err := c.Execute("SELECT MASTER_GTID_WAIT('" + pos + "', 60)")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := r.GetInt(0, 0); v != 0 {
		r, _ := c.Execute("SHOW SLAVE STATUS")
		var why string
		if r != nil && r.RowNumber() > 0 {
			io, _ := r.GetStringByName(0, "Last_IO_Error")
			sql, _ := r.GetStringByName(0, "Last_SQL_Error")
			why = "IO: " + io + "; SQL: " + sql
		}
		t.Fatalf("the replica never reached %s: %s", pos, why)
	}
}

// promote makes replica a primary: it stops replicating and takes writes.
func promote(t *testing.T, replica server) {
	t.Helper()
	exec(t, connect(t, replica), "STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL replicate_do_db = ''", "SET GLOBAL read_only = OFF")
}

// repoint moves the route's address to srv, as a virtual IP moves: the
// connections to the old server end, new ones reach srv. It returns when.
func (r *route) repoint(srv server) time.Time {
	r.srv = srv
	r.p.SetTarget(srv.addr())
	r.p.CloseConns()
	return time.Now()
}

// waitNewSession waits until n has begun a session since st (a read of
// the table or a resume) and follows with every change committed before
// it; it returns how long that took since from.
func (n *node[K]) waitNewSession(t *testing.T, st Stats, from time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		now := n.follower.Stats()
		if now.FullReads+now.Resumes > st.FullReads+st.Resumes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new session: state %v, last error %v, reads %d, resumes %d", now.State, now.LastError, now.FullReads, now.Resumes)
		}
		time.Sleep(5 * time.Millisecond)
	}
	n.waitCurrent(t)
	return time.Since(from)
}

// checkKeys checks every key of n's table on n (wrong404s) and fails the
// test on a wrong 404.
func (n *node[K]) checkKeys(t *testing.T, what string, parse func(string) (K, error)) int {
	t.Helper()
	checked, wrong := n.wrong404s(t, parse)
	t.Logf("%s: %d keys checked, %d wrong 404s", what, checked, wrong)
	if wrong != 0 {
		t.Errorf("%s: %d wrong 404s among %d committed keys", what, wrong, checked)
	}
	if checked == 0 {
		t.Errorf("%s: no key checked", what)
	}
	return checked
}

// probe inserts keys of a range of its own (never deleted) on srv, one a
// transaction every few milliseconds, and checks each on n as soon as n
// says it follows with every change committed before the insert
// returned: a key then absent while the Loader is ready is a wrong 404.
// It runs until stop is called, which returns the keys checked and the
// wrong 404s.
func probe[K comparable](t *testing.T, srv server, n *node[K], table string, from int64, key func(int64) K) (stop func() (checked, wrong int)) {
	t.Helper()
	type insert struct {
		id        int64
		committed time.Time
	}
	c := connect(t, srv)
	done := make(chan struct{})
	inserts := make(chan insert, 1<<14)
	var checked, wrong int
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(inserts)
		for id := from; ; id++ {
			select {
			case <-done:
				return
			case <-time.After(3 * time.Millisecond):
			}
			if _, err := c.Execute(fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, id)); err != nil {
				t.Errorf("probe insert: %v", err)
				return
			}
			inserts <- insert{id, time.Now()}
		}
	})
	wg.Go(func() {
		for in := range inserts {
			for deadline := in.committed.Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				st := n.follower.Stats()
				if st.State != Following || !n.loader.Ready() || !st.CurrentAsOf.After(in.committed) {
					continue
				}
				checked++
				if !n.loader.MayContain(key(in.id)) && n.loader.Ready() {
					wrong++
					t.Errorf("probe: key %d committed at %v reads absent on a ready Loader current as of %v",
						in.id, in.committed.Format(time.StampMicro), st.CurrentAsOf.Format(time.StampMicro))
				}
				break
			}
		}
	})
	return func() (int, int) {
		close(done)
		wg.Wait()
		return checked, wrong
	}
}

// TestSwitchToReplica follows a table on a primary through a TCP proxy
// (the DSN's address, as a virtual IP) while writers commit inserts,
// deletes and key updates, then switches the source to a GTID replica
// (a second server, server_id 2): writes stop, the replica catches up and
// is promoted, the proxy moves to it, and writes go on there. The
// follower must follow again, with every key of both eras present and
// the deleted ones absent once applied. The replica has another
// server_id, so the follower does not resume there: it reads the table
// again (a resume by GTID across servers is not built).
func TestSwitchToReplica(t *testing.T) {
	primary := ownDatabase(t, testDSN(t))
	replica := secondServer(t, 2, primary.db)
	startReplica(t, primary, replica)

	const space = 20000
	table, c := newTable(t, primary, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	insertRange(t, c, table, 0, space/4)
	route, via := newRoute(t, primary)
	n := startNode(t, via, table, "id", parseInt64)
	n.conn = connect(t, primary) // the checks' own, not through the route
	w := startWriters(t, primary, table, 2, space)
	stopProbe := probe(t, primary, n, table, 10*space, ident)
	n.waitCurrent(t)
	time.Sleep(500 * time.Millisecond) // writes under way
	n.checkKeys(t, "on the primary, writers running", parseInt64)
	w.halt()
	probed, wrongProbes := stopProbe()
	era1 := w.commits.Load()

	// The switch: writes stopped, the replica caught up and promoted, the
	// address moved, writes on the new primary (keys of twice the space).
	catchUp(t, primary, replica)
	promote(t, replica)
	before := n.follower.Stats()
	at := route.repoint(replica)
	n.conn = connect(t, replica)
	w = startWriters(t, replica, table, 2, 2*space)
	stopProbe = probe(t, replica, n, table, 20*space, ident)
	took := n.waitNewSession(t, before, at)
	after := n.follower.Stats()
	t.Logf("switch to the replica: following %v after the switch; reads %d→%d, resumes %d→%d, read reason %q, last error %v",
		took, before.FullReads, after.FullReads, before.Resumes, after.Resumes, after.ReadReason, after.LastError)
	time.Sleep(500 * time.Millisecond) // writes under way on the new primary
	checked := n.checkKeys(t, "on the new primary, writers running", parseInt64)
	w.halt()
	p, wp := stopProbe()
	t.Logf("probes (a key checked as soon as the follower is current with its insert): %d checked before the switch, %d after, wrong 404s %d and %d",
		probed, p, wrongProbes, wp)
	checked += n.checkKeys(t, "on the new primary, writes stopped", parseInt64)
	absent, rejected := n.absentRejected(t, 2*space, ident)
	t.Logf("deleted or never written: %d of %d absent ids read absent; writer commits %d before the switch, %d after; %d keys checked after it",
		rejected, absent, era1, w.commits.Load(), checked)
	if rejected == 0 {
		t.Errorf("no absent id reads absent (%d absent): the guard holds every key", absent)
	}
	if st := n.follower.Stats(); st.ServerID == 0 || st.State != Following {
		t.Errorf("at the end: %+v", st)
	}
}

// TestSwitchToUnrelated repoints a follower's address to a server that is
// not a replica of the one it followed: the same database and table
// names, other rows, a binlog of its own after RESET MASTER. First with
// another server_id (2), then, back on the first server, with the same
// server_id as it (1, MariaDB's default, so that only the binlog tells
// them apart). The follower must never keep the guard of the server it
// left: it reads the new server's table, whose every key then reads
// present, and the old server's keys read absent (but for a guard's
// false positives).
func TestSwitchToUnrelated(t *testing.T) {
	first := ownDatabase(t, testDSN(t))
	other := secondServer(t, 2, first.db)

	const space = 10000
	table, c := newTable(t, first, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	insertRange(t, c, table, 0, space/2)
	oc := connect(t, other)
	exec(t, oc, "RESET MASTER", "CREATE TABLE `"+table+"` (id BIGINT NOT NULL PRIMARY KEY, v INT) ENGINE=InnoDB")
	insertRange(t, oc, table, 1_000_000, 1_000_000+space/2)

	route, via := newRoute(t, first)
	n := startNode(t, via, table, "id", parseInt64)
	n.conn = connect(t, first)
	w := startWriters(t, first, table, 2, space)
	n.waitCurrent(t)
	time.Sleep(300 * time.Millisecond)
	w.halt()
	n.checkKeys(t, "on the first server", parseInt64)

	for _, step := range []struct {
		name     string
		serverID int
	}{{"another server_id", 2}, {"the same server_id", 1}} {
		// The keys the follower had: the first server's.
		old := n.keys(t)
		exec(t, oc, fmt.Sprintf("SET GLOBAL server_id = %d", step.serverID), "RESET MASTER",
			fmt.Sprintf("DELETE FROM `%s` WHERE id < 1000000", table))
		insertRange(t, oc, table, 2_000_000+step.serverID*space, 2_000_000+step.serverID*space+space/4)

		before := n.follower.Stats()
		at := route.repoint(other)
		n.conn = connect(t, other)
		took := n.waitNewSession(t, before, at)
		after := n.follower.Stats()
		t.Logf("%s: following %v after the switch; reads %d→%d, resumes %d→%d, read reason %q, last error %v",
			step.name, took, before.FullReads, after.FullReads, before.Resumes, after.Resumes, after.ReadReason, after.LastError)
		if after.FullReads == before.FullReads || after.Resumes != before.Resumes {
			t.Errorf("%s: reads %d→%d, resumes %d→%d; want a read of the new server's table and no resume",
				step.name, before.FullReads, after.FullReads, before.Resumes, after.Resumes)
		}
		n.checkKeys(t, step.name+": the unrelated server's table", parseInt64)
		kept := 0
		for _, s := range old {
			id, _ := parseInt64(s)
			if n.loader.MayContain(id) {
				kept++
			}
		}
		t.Logf("%s: %d of the %d keys of the server left still read present", step.name, kept, len(old))
		if kept > len(old)/10 {
			t.Errorf("%s: %d of the %d keys of the server left still read present: the old guard was kept", step.name, kept, len(old))
		}

		// Back to the first server, which the follower reads again (the
		// other server's id, or its binlog, is not the first's).
		before = n.follower.Stats()
		at = route.repoint(first)
		n.conn = connect(t, first)
		took = n.waitNewSession(t, before, at)
		after = n.follower.Stats()
		t.Logf("%s: back on the first server, following %v after the switch; read reason %q", step.name, took, after.ReadReason)
		n.checkKeys(t, step.name+": back on the first server", parseInt64)
	}
}
