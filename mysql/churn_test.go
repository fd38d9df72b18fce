package mysql

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// TestChurnDuringWrites looks keys up while writers delete and insert them
// again, each row version with a value of its own: a key the ready Loader
// reports absent while the same row version was visible before the lookup
// (and before a heartbeat that came back) and is still visible after it
// is a wrong 404, whatever the writers do meanwhile. A deletion applied
// when the binlog carries it, before the server makes its transaction
// visible, is one.
//
// Under semi-synchronous replication with wait point AFTER_SYNC the
// server sends a transaction's binlog events, then waits for a replica's
// acknowledgement before it commits the transaction in the engine: the
// follower (an asynchronous reader) has the events for as long as the
// acknowledgement takes, while every query still finds the deleted rows.
// The second case connects a semi-synchronous replica of its own whose
// acknowledgements are 20 ms late.
func TestChurnDuringWrites(t *testing.T) {
	srv := testDSN(t)
	t.Run("async", func(t *testing.T) { churn(t, srv) })
	t.Run("semi-sync, acks 20 ms late", func(t *testing.T) {
		c := connect(t, srv)
		exec(t, c, "SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC'", "SET GLOBAL rpl_semi_sync_master_enabled = ON")
		t.Cleanup(func() {
			exec(t, connect(t, srv), "SET GLOBAL rpl_semi_sync_master_enabled = OFF", "SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_COMMIT'")
		})
		slowReplica(t, srv, 20*time.Millisecond)
		churn(t, srv)
		r, err := c.Execute("SHOW STATUS LIKE 'Rpl_semi_sync_master_yes_tx'")
		if err != nil {
			t.Fatal(err)
		}
		yes, _ := r.GetString(0, 1)
		t.Logf("%s transactions acknowledged by the semi-synchronous replica", yes)
		if yes == "0" {
			t.Fatal("no transaction waited for the semi-synchronous replica")
		}
	})
}

// slowReplica connects a semi-synchronous replica (a binlog reader that
// acknowledges what it receives) whose writes, and so its
// acknowledgements, reach the server d late. It stops when the test ends.
func slowReplica(t *testing.T, srv server, d time.Duration) {
	t.Helper()
	c := connect(t, srv)
	r, err := c.Execute("SHOW MASTER STATUS")
	if err != nil {
		t.Fatal(err)
	}
	file, _ := r.GetString(0, 0)
	pos, _ := r.GetInt(0, 1)
	dialer := &net.Dialer{}
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{ServerID: 1<<30 + 5200, Flavor: gomysql.MariaDBFlavor,
		Host: srv.host, Port: srv.port, User: srv.user, Password: srv.password, DisableRetrySync: true, Logger: quiet,
		SemiSyncEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := dialer.DialContext(ctx, network, addr)
			return lateWrites{nc, d}, err
		}})
	stream, err := syncer.StartSync(gomysql.Position{Name: file, Pos: uint32(pos)})
	if err != nil {
		syncer.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := stream.GetEvent(ctx); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		syncer.Close()
	})
}

// lateWrites delays every write to its connection.
type lateWrites struct {
	net.Conn
	d time.Duration
}

func (c lateWrites) Write(p []byte) (int, error) {
	time.Sleep(c.d) // the network's delay, not a synchronisation
	return c.Conn.Write(p)
}

// churn is TestChurnDuringWrites on a table of its own.
func churn(t *testing.T, srv server) {
	const space = 2000
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL", "")
	var version atomic.Int64
	var b strings.Builder
	for id := range space {
		if id > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "(%d,%d)", id, version.Add(1))
	}
	exec(t, c, "INSERT INTO `"+table+"` (id, v) VALUES "+b.String())
	n := startNode(t, srv, table, "id", parseInt64)
	n.waitCurrent(t)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var churned atomic.Int64
	for i := range 4 {
		wg.Go(func() {
			w, err := client.ConnectWithTimeout(srv.addr(), srv.user, srv.password, srv.db, 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer w.Close()
			rnd := rand.New(rand.NewPCG(uint64(i), 52))
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := rnd.Int64N(space)
				if _, err := w.Execute(fmt.Sprintf("DELETE FROM `%s` WHERE id = %d", table, id)); err != nil {
					t.Error(err)
					return
				}
				if _, err := w.Execute(fmt.Sprintf("INSERT INTO `%s` (id, v) VALUES (%d, %d)", table, id, version.Add(1))); err != nil && !isServerErr(err) {
					t.Error(err)
					return
				}
				churned.Add(1)
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	versions := func(where string) map[int64]int64 {
		r, err := n.conn.Execute("SELECT id, v FROM `" + table + "`" + where)
		if err != nil {
			t.Fatal(err)
		}
		m := make(map[int64]int64, r.RowNumber())
		for i := range r.RowNumber() {
			id, _ := r.GetInt(i, 0)
			v, _ := r.GetInt(i, 1)
			m[id] = v
		}
		return m
	}
	d := 3 * time.Second
	if testing.Short() {
		d = time.Second
	}
	var checked, wrong, rounds int
	for end := time.Now().Add(d); time.Now().Before(end); rounds++ {
		before := versions("")
		n.waitCurrent(t)
		var absent []string
		for id := range before {
			if !n.loader.MayContain(id) && n.loader.Ready() {
				absent = append(absent, fmt.Sprint(id))
			}
			checked++
		}
		if len(absent) == 0 {
			continue
		}
		after := versions(" WHERE id IN (" + strings.Join(absent, ",") + ")")
		for id, v := range after {
			if before[id] == v {
				wrong++
				t.Logf("wrong 404: key %d, row version %d visible before the lookup and after it", id, v)
			}
		}
	}
	t.Logf("%d rounds, %d keys checked during %d deletes and inserts again: %d wrong 404s", rounds, checked, churned.Load(), wrong)
	if wrong != 0 {
		t.Fatalf("%d wrong 404s of %d keys checked during the writes", wrong, checked)
	}
}
