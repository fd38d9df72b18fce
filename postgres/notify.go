package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// followNotify is one session of a WithNotify follower: connect, LISTEN,
// read the table under a snapshot, apply the notifications the read did
// not see, with a heartbeat. It sets *following when the marker comes
// back.
func (f *Follower[K]) followNotify(ctx context.Context, following *time.Time) error {
	listen, err := f.connect(ctx, "listen")
	if err != nil {
		return err
	}
	defer listen.Close(context.WithoutCancel(ctx))
	f.pid.Store(listen.PgConn().PID())
	// LISTEN before the read: a write committed between the two reaches
	// us as a notification, and the snapshot tells whether the read saw it.
	lctx, cancel := context.WithTimeout(ctx, f.deadline)
	_, err = listen.Exec(lctx, "LISTEN "+pgx.Identifier{Channel(f.table)}.Sanitize())
	cancel()
	if err != nil {
		return failed(ReasonListen, fmt.Errorf("postgres: follower listen: %w", err))
	}
	f.state.Store(int32(Resyncing))
	sender, err := f.connect(ctx, "read") // reads the table, then sends the heartbeats
	if err != nil {
		return err
	}
	defer sender.Close(context.WithoutCancel(ctx))
	// A table without the trigger sends nothing but our own heartbeats:
	// it would look healthy and miss every change.
	if err := checkInstalled(ctx, sender, f.table); err != nil {
		if errors.Is(err, ErrNotInstalled) {
			return failed(ReasonNotInstalled, err)
		}
		return failed(ReasonResync, err)
	}
	start := time.Now()
	sn, n, err := f.readNotify(ctx, sender)
	if err != nil {
		return failed(ReasonResync, err)
	}
	f.read(ctx, f.needRead, n, time.Since(start))
	f.needRead = ""
	// The Loader stays invalid until the marker sent after the read comes
	// back: every change committed during the read arrives before it and
	// is applied first. If it never comes, the connection cannot LISTEN.
	s, err := f.startSession(ctx, newToken(), following, func(ctx context.Context, payload string) error {
		return f.notifyPayload(ctx, sender, payload)
	})
	if err != nil {
		return err
	}
	defer s.stop() // before sender closes (deferred earlier)
	noMarker := func(waited time.Duration) error { return f.noMarker(ctx, listen, waited) }
	for {
		wctx, cancel := f.wakeCtx(s)
		n, err := listen.WaitForNotification(wctx)
		cancel()
		now := time.Now()
		if err := s.waitEnded(ctx, "wait", err); err != nil {
			return err
		}
		if err == nil {
			s.hb.last = now
			if !f.control(s, n.Payload, now) {
				if err := f.notification(n.Payload, sn, now); err != nil {
					return failed(ReasonNotification, err)
				}
			}
		}
		if err := f.tick(s, now, noMarker); err != nil {
			return err
		}
	}
}

// noMarker ends a session whose marker has not come back on the LISTEN
// connection after waited. If that connection still answers a query, it
// is alive and delivers no notifications: ErrNoNotifications (a PgBouncer
// in transaction pooling mode accepts LISTEN and delivers nothing). If it
// does not, it is dead, which a reconnect may mend.
func (f *Follower[K]) noMarker(ctx context.Context, listen *pgx.Conn, waited time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	if _, err := listen.Exec(pctx, "SELECT 1"); err != nil {
		return failed(ReasonConnectionLost, fmt.Errorf("postgres: follower: the marker sent %v ago has not come back, and the LISTEN connection does not answer: %w",
			waited.Round(time.Millisecond), err))
	}
	return failed(ReasonNoNotifications, fmt.Errorf("%w: the marker the follower sent %v ago through the database has not come back, though the LISTEN connection answers queries (a transaction-pooling PgBouncer delivers nothing)",
		ErrNoNotifications, waited.Round(time.Millisecond)))
}

// notification applies one payload of the trigger.
func (f *Follower[K]) notification(payload string, sn Snapshot, now time.Time) error {
	c, err := ParseChange(payload)
	if err != nil {
		return err // a payload we do not understand: start over
	}
	switch c.Op {
	case Resync:
		return errResync
	case Marker, Heartbeat:
		return nil // control handles this session's; these are others'
	}
	// Skip what the read saw, and this process's own inserts (its Loader
	// added them before writing). Its own deletes and updates are applied
	// here: the Loader's Delete removes nothing while a feed is attached.
	if tag := *f.tag.Load(); sn.Visible(c.TxID) || (tag != "" && c.Origin == tag && c.Op == Insert) {
		f.skipped.Add(1)
		return nil
	}
	if c.Op == Update {
		if err := f.apply(c.OldKey, true); err != nil {
			return err
		}
	}
	if err := f.apply(c.Key, c.Op == Delete); err != nil {
		return err
	}
	f.applied.Add(1)
	f.lastApplied.Store(now.UnixNano())
	return nil
}

// apply parses key and applies its creation or, if deleted, its deletion.
func (f *Follower[K]) apply(key string, deleted bool) error {
	k, err := f.parse(key)
	if err != nil {
		return fmt.Errorf("postgres: follower: parse key %q: %w", key, err)
	}
	return f.feed.Apply(guarded.Change[K]{Key: k, Deleted: deleted})
}

// notifyPayload sends payload on the follower's channel through c, within
// the heartbeat deadline.
func (f *Follower[K]) notifyPayload(ctx context.Context, c *pgx.Conn, payload string) error {
	nctx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	if _, err := c.Exec(nctx, `SELECT pg_notify($1, $2)`, Channel(f.table), payload); err != nil {
		return fmt.Errorf("postgres: follower notify: %w", err)
	}
	return nil
}

// readNotify reads every key under a snapshot into a fresh guard of the
// Loader, on the connection reader, and returns the snapshot and how many
// keys it read.
//
// The snapshot is taken inside the Loader's Resync, after the fresh guard
// is installed for inserts: Resync waits for this process's inserts in
// flight, whose own notifications the follower skips, so each of them has
// either committed before the snapshot (and the read sees it) or reaches
// the fresh guard directly. Taken earlier, an insert that had added its key
// to the old guard only and committed after the snapshot would be lost.
func (f *Follower[K]) readNotify(ctx context.Context, reader *pgx.Conn) (Snapshot, int64, error) {
	var sn Snapshot
	var n int64
	err := f.feed.Resync(ctx, func(ctx context.Context, add func(K) error) error {
		tx, s, err := ReadSnapshot(ctx, reader)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		sn = s
		n, err = f.scan(ctx, tx, add)
		return err
	})
	if err != nil {
		return Snapshot{}, 0, fmt.Errorf("postgres: follower resync: %w", err)
	}
	// Notifications are delivered in commit order, so once the session's
	// marker arrives, so has every change committed before it, including
	// those committed during the read.
	return sn, n, nil
}

// scan reads every key of the table in tx into add, and returns how many.
func (f *Follower[K]) scan(ctx context.Context, tx pgx.Tx, add func(K) error) (int64, error) {
	query := fmt.Sprintf("SELECT %s::text FROM %s", pgx.Identifier{f.key}.Sanitize(), sanitizeTable(f.table))
	rows, err := tx.Query(ctx, query)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return n, err
		}
		k, err := f.parse(s)
		if err != nil {
			return n, fmt.Errorf("parse key %q: %w", s, err)
		}
		if err := add(k); err != nil {
			return n, err
		}
		n++
	}
	return n, rows.Err()
}
