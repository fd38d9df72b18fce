package mysql

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
)

// writers commit random inserts, deletes and key updates of ids in
// [0, space) to a table through connections of their own, until stopped.
type writers struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	commits atomic.Int64
	errs    atomic.Int64
}

// startWriters starts n writers on table; stop them with w.halt (the test
// does at its end, if it has not).
func startWriters(t *testing.T, srv server, table string, n int, space int64) *writers {
	t.Helper()
	w := &writers{stop: make(chan struct{})}
	for i := range n {
		w.wg.Go(func() { w.run(srv, table, space, uint64(i)) })
	}
	t.Cleanup(w.halt)
	return w
}

// halt stops the writers and waits for them.
func (w *writers) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

func (w *writers) run(srv server, table string, space int64, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	var c *client.Conn
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		if c == nil {
			var err error
			if c, err = client.ConnectWithTimeout(srv.addr(), srv.user, srv.password, srv.db, 5*time.Second); err != nil {
				w.errs.Add(1)
				time.Sleep(20 * time.Millisecond) // the server restarts
				continue
			}
		}
		a, b := rnd.Int64N(space), rnd.Int64N(space)
		var q string
		switch op := rnd.IntN(10); {
		case op < 5:
			q = fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d), (%d)", table, a, b)
		case op < 8:
			q = fmt.Sprintf("DELETE FROM `%s` WHERE id IN (%d, %d)", table, a, b)
		default:
			q = fmt.Sprintf("UPDATE `%s` SET id = %d WHERE id = %d", table, b, a)
		}
		if _, err := c.Execute(q); err != nil {
			w.errs.Add(1) // a duplicate key, the table gone for a moment, the server restarting
			if isConnErr(err) {
				c.Close()
				c = nil
			}
			continue
		}
		w.commits.Add(1)
	}
}

// isConnErr reports whether err is not the server's answer to a statement
// but a broken connection.
func isConnErr(err error) bool { return !isServerErr(err) }
