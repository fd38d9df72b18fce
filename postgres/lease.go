package postgres

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// A lease is a relay's right to relay (follow.Lease): a PostgreSQL advisory lock held in
// a transaction whose session the server ends once it sits idle for the
// lease's length (idle_in_transaction_session_timeout). The relay renews
// it with a statement every heartbeat; a relay that stops renewing it (a
// stopped process, a long pause, a frozen VM, a lost connection) loses it
// within the lease, the lock is free, and another replica takes it, and
// the slot (withSlotTakeover).
//
// The transaction never takes a transaction id and runs in READ
// COMMITTED, so holding it for days holds back no vacuum.
//
// Each lease has a term: a transaction id taken once the lock is held,
// larger than any taken before it, so larger than the term of every
// earlier holder. The relay stamps its messages with it, and followers
// ignore messages of an older term than one they have seen: a relay that
// wakes up after losing its lease (fencing). The relay itself stops
// publishing once its lease may have lapsed by its own clock.
type lease struct {
	conn   *pgx.Conn
	length time.Duration
	term   uint64
	// renewed is when the last renewal that succeeded was sent (unix
	// nanoseconds): the server ends the session no sooner than the lease's
	// length after it received it, which was after it was sent.
	renewed atomic.Int64
}

// acquire tries to take the lease of relay name: nil, nil if another
// holds it. conf is the relay's connection config; length the lease.
func acquire(ctx context.Context, conf *pgx.ConnConfig, name string, length, deadline time.Duration) (*lease, error) {
	c := conf.Copy()
	c.RuntimeParams["application_name"] = "cuckooguard relay lock " + name
	c.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, c)
	if err != nil {
		return nil, fmt.Errorf("postgres: relay: connect: %w", err)
	}
	l := &lease{conn: conn, length: length}
	sent := time.Now()
	got, err := l.begin(cctx, name)
	if err != nil || !got {
		l.Release()
		return nil, err
	}
	l.renewed.Store(sent.UnixNano())
	// The term, on a connection of its own: the lease's transaction must
	// take no transaction id.
	tc, err := pgx.ConnectConfig(cctx, c)
	if err == nil {
		var text string
		err = tc.QueryRow(cctx, `SELECT pg_current_xact_id()::text`).Scan(&text)
		closeQuickly(tc)
		if err == nil {
			l.term, err = strconv.ParseUint(text, 10, 64)
		}
	}
	if err != nil {
		l.Release()
		return nil, fmt.Errorf("postgres: relay: take a term: %w", err)
	}
	return l, nil
}

// begin opens the lease's transaction and tries the lock.
func (l *lease) begin(ctx context.Context, name string) (bool, error) {
	ms := strconv.FormatInt(max(l.length.Milliseconds(), 1), 10)
	var got bool
	_, err := l.conn.Exec(ctx, `BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = `+ms)
	if err == nil {
		err = l.conn.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, "cuckooguard relay "+name).Scan(&got)
	}
	if err != nil {
		return false, fmt.Errorf("postgres: relay: try the lease: %w", err)
	}
	return got, nil
}

// Renew renews the lease: an error means it is lost (or will be).
func (l *lease) Renew(ctx context.Context, deadline time.Duration) error {
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	if _, err := l.conn.Exec(rctx, "SELECT 1"); err != nil {
		return fmt.Errorf("postgres: relay: renew the lease: %w", err)
	}
	l.renewed.Store(sent.UnixNano())
	return nil
}

// Held reports whether the lease is surely still held at now, by this
// process's clock: the last renewal was sent less than the lease's length
// ago, less a margin for the clocks' rates.
func (l *lease) Held(now time.Time) bool {
	until := time.Unix(0, l.renewed.Load()).Add(l.length - l.length/10)
	return now.Before(until)
}

// Release gives the lease up: the session ends, and the lock with it.
func (l *lease) Release() { closeQuickly(l.conn) }

// Term returns the lease's term.
func (l *lease) Term() uint64 { return l.term }

// closeQuickly closes c, waiting at most closeWait for a server that does
// not answer: a Run must return promptly whatever the network does.
func closeQuickly(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	c.Close(ctx)
}

// closeWait bounds the goodbyes to a server, on the way out.
const closeWait = 250 * time.Millisecond
