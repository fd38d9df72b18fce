package mysql

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"sync/atomic"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"github.com/cuckooguard/cuckooguard/follow"
)

// A relayLease is a relay's right to relay (follow.Lease): a named lock
// (GET_LOCK) held by a connection of its own whose wait_timeout is the
// lease's length, so that the server ends the connection, and frees the
// lock, once it sits idle for that long. The relay renews it with a
// statement every heartbeat; a relay that stops renewing it (a stopped
// process, a long pause, a lost connection) loses it within the lease,
// and another replica takes it.
//
// Its term is the relay's row's term in cuckooguard_relay, incremented
// once the lock is held (LAST_INSERT_ID(term + 1)): larger than the term
// of every earlier holder.
type relayLease struct {
	c         *client.Conn
	closeConn func()
	length    time.Duration
	term      uint64
	renewed   atomic.Int64 // unix nanoseconds: when the last renewal that succeeded was sent
}

var _ follow.Lease = (*relayLease)(nil)

// lockName is the name of the lock of relay name: at most 64 characters.
func lockName(name string) string {
	s := "cuckooguard relay " + name
	if len(s) > 64 {
		h := fnv.New32a()
		h.Write([]byte(name))
		s = fmt.Sprintf("%s %08x", s[:55], h.Sum32())
	}
	return s
}

func (d *relayed) Lease(ctx context.Context, name string, length, deadline time.Duration) (follow.Lease, error) {
	cctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	// The lease's connection outlives ctx; deadline bounds its handshake.
	c, closeConn, err := dial(context.WithoutCancel(cctx), d.srv, deadline)
	if err != nil {
		return nil, fmt.Errorf("mysql: relay: connect: %w", err)
	}
	l := &relayLease{c: c, closeConn: closeConn, length: length}
	sent := time.Now()
	_ = c.SetDeadline(sent.Add(deadline))
	secs := int64(math.Ceil(length.Seconds()))
	if _, err := c.Execute(fmt.Sprintf("SET SESSION wait_timeout = %d", max(secs, 1))); err != nil {
		l.Release()
		return nil, fmt.Errorf("mysql: relay: set the lease's wait_timeout: %w", err)
	}
	r, err := c.Execute("SELECT GET_LOCK(?, 0)", lockName(name))
	if err != nil {
		l.Release()
		return nil, fmt.Errorf("mysql: relay: try the lease: %w", privilege(err))
	}
	if got, _ := r.GetInt(0, 0); got != 1 {
		l.Release()
		return nil, nil
	}
	l.renewed.Store(sent.UnixNano())
	// The term on the lock's own connection: if it died after GET_LOCK,
	// another relay may hold the lock now, and must have the larger term.
	if l.term, err = d.takeTerm(c, name); err != nil {
		l.Release()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return l, nil
}

// takeTerm increments the term of relay name through c, the connection
// that holds its lock, and returns it.
func (d *relayed) takeTerm(c *client.Conn, name string) (uint64, error) {
	if err := ensureTable(c, d.srv.db, relayTable, relayColumns); err != nil {
		return 0, err
	}
	if _, err := c.Execute("INSERT IGNORE INTO `"+relayTable+"` (name) VALUES (?)", name); err != nil {
		return 0, fmt.Errorf("mysql: relay: take a term: %w", privilege(err))
	}
	if _, err := c.Execute("UPDATE `"+relayTable+"` SET term = LAST_INSERT_ID(term + 1) WHERE name = ?", name); err != nil {
		return 0, fmt.Errorf("mysql: relay: take a term: %w", privilege(err))
	}
	r, err := c.Execute("SELECT LAST_INSERT_ID()")
	if err != nil {
		return 0, fmt.Errorf("mysql: relay: take a term: %w", err)
	}
	term, _ := r.GetUint(0, 0)
	if term == 0 {
		return 0, fmt.Errorf("mysql: relay: take a term: no term for relay %s", name)
	}
	return term, nil
}

func (l *relayLease) Term() uint64 { return l.term }

// Renew renews the lease: an error means it is lost (or will be).
func (l *relayLease) Renew(ctx context.Context, deadline time.Duration) error {
	sent := time.Now()
	_ = l.c.SetDeadline(sent.Add(deadline))
	stop := context.AfterFunc(ctx, func() { _ = l.c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := l.c.Execute("SELECT 1"); err != nil {
		return fmt.Errorf("mysql: relay: renew the lease: %w", err)
	}
	l.renewed.Store(sent.UnixNano())
	return nil
}

// Held reports whether the lease is surely still held at now, by this
// process's clock: the last renewal was sent less than the lease's length
// ago, less a margin for the clocks' rates.
func (l *relayLease) Held(now time.Time) bool {
	until := time.Unix(0, l.renewed.Load()).Add(l.length - l.length/10)
	return now.Before(until)
}

// Release gives the lease up: the connection ends, and the lock with it.
func (l *relayLease) Release() {
	_ = l.c.SetDeadline(time.Now().Add(closeWait))
	l.closeConn()
}
