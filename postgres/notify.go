package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// followNotify is one session of a WithNotify follower: connect, LISTEN,
// read the table under a snapshot, apply the notifications the read did
// not see, with a heartbeat. It sets *following when the marker comes
// back.
func (f *Follower[K]) followNotify(ctx context.Context, following *time.Time) error {
	listen, err := f.dial.connect(ctx, "listen")
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
	sender, err := f.dial.connect(ctx, "read") // reads the table, then sends the heartbeats
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
	rel, err := resolve(ctx, sender, f.table)
	if err != nil {
		return failed(ReasonResync, err)
	}
	if err := f.readRule(ctx, sender, rel); err != nil {
		return err
	}
	start := time.Now()
	sn, n, err := f.readNotify(ctx, sender, rel)
	if err != nil {
		return failed(ReasonResync, err)
	}
	f.read(ctx, cmpOr(f.pending, ReadNoResume), n, time.Since(start))
	f.streamStarted()
	var own ownInserts[K]
	// The Loader stays invalid until the marker sent after the read comes
	// back: every change committed during the read arrives before it and
	// is applied first. If it never comes, the connection cannot LISTEN.
	s, err := f.startSession(ctx, newToken(), "", following, func(ctx context.Context, payload string) error {
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
			if control, _ := f.control(s, n.Payload, now); !control {
				if err := f.notification(n.Payload, sn, &own, now); err != nil {
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

// ownInserts is what a NOTIFY follower knows of this process's own
// inserts in the transaction whose notifications it reads: the keys its
// tags name, each to be skipped once.
type ownInserts[K comparable] struct {
	tx   uint64
	keys map[K]int
}

// notification applies one payload of the trigger.
func (f *Follower[K]) notification(payload string, sn Snapshot, own *ownInserts[K], now time.Time) error {
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
	// Skip what the read saw, and this process's own inserts: the keys
	// its tags name (the trigger copies them into every notification of
	// the transaction), each once, since its Loader added them. Its own
	// deletes and updates are applied here: the Loader's Delete removes
	// nothing while a feed is attached.
	if sn.Visible(c.TxID) {
		f.skipped.Add(1)
		return nil
	}
	// The trigger sends the keys' ::text, the read their output (a host's
	// inet without /32): both in the column's canonical form.
	if c.Key, err = f.rule.fromServer(c.Key); err != nil {
		return err
	}
	if c.Op == Update {
		if c.OldKey, err = f.rule.fromServer(c.OldKey); err != nil {
			return err
		}
	}
	if c.Op == Insert {
		if own.tx != c.TxID {
			own.tx, own.keys = c.TxID, f.tags.Own([][]byte{[]byte(c.Origin)})
		}
		if k, err := f.parse(c.Key); err == nil && own.keys[k] > 0 {
			own.keys[k]--
			f.skipped.Add(1)
			return nil
		}
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
func (f *Follower[K]) readNotify(ctx context.Context, reader *pgx.Conn, rel relation) (Snapshot, int64, error) {
	var sn Snapshot
	var n int64
	err := f.feed.Resync(ctx, func(ctx context.Context, add func(K) error) error {
		tx, s, err := ReadSnapshot(ctx, reader)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		sn = s
		n, err = f.scan(ctx, tx, rel, add)
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

// scan reads every key of rel in tx into add, in the column's canonical
// form, and returns how many. The keys are read as the type's output
// function prints them, which is how the change stream carries them (the
// connection's simple protocol returns text), and made canonical
// (keys.go) as the stream's are.
func (f *Follower[K]) scan(ctx context.Context, tx pgx.Tx, rel relation, add func(K) error) (int64, error) {
	if err := pinLocal(ctx, tx, f.dial.conf.RuntimeParams); err != nil {
		return 0, err
	}
	cols := columnsOf(f.key)
	rows, err := tx.Query(ctx, fmt.Sprintf("SELECT %s FROM %s", sanitizeColumns(cols), rel.from()))
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		if fds := rows.FieldDescriptions(); n == 0 && (len(fds) != len(cols) || slices.ContainsFunc(fds, func(fd pgconn.FieldDescription) bool { return fd.Format != pgx.TextFormatCode })) {
			return 0, errors.New("postgres: follower read: the key column did not come back as text")
		}
		text, ok, err := keyText(f.rule, rows.RawValues())
		if err != nil {
			return n, err
		}
		if !ok {
			continue // a NULL in a key of several columns: no key
		}
		k, err := f.parse(text)
		if err != nil {
			return n, fmt.Errorf("parse key %q: %w", text, err)
		}
		if err := add(k); err != nil {
			return n, err
		}
		n++
	}
	return n, rows.Err()
}

// ReadTable reads every key of table's keyColumn (or columns: [Columns];
// each key then a [Tuple]) through conn into add,
// under a snapshot it returns, for a follower of another change stream
// (the fanout module's) that reads the table and then applies the changes
// that the snapshot does not see ([Snapshot.Visible],
// [Snapshot.VisibleXid]). Keys come in the canonical form of the column's
// type, as a [Source] streams them (the README's "Key types"), from what
// the type's output function prints with the settings that shape printed
// values (DateStyle, TimeZone and the like) as the Source's stream has
// them, unless conn's startup parameters set them: set them alike for
// both, or for neither. It returns how many keys it read, and an error
// wrapping [ErrKeyType] for a key column whose type cannot be followed.
func ReadTable(ctx context.Context, conn *pgx.Conn, table, keyColumn string, add func(text string) error) (Snapshot, int64, error) {
	switch {
	case ctx == nil || conn == nil || add == nil:
		return Snapshot{}, 0, errors.New("postgres: ReadTable needs a context, a connection and an add function")
	case table == "" || keyColumn == "":
		return Snapshot{}, 0, errors.New("postgres: ReadTable needs a table and a key column")
	}
	rel, err := resolve(ctx, conn, table)
	if err != nil {
		return Snapshot{}, 0, err
	}
	tx, sn, err := ReadSnapshot(ctx, conn)
	if err != nil {
		return Snapshot{}, 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := pinLocal(ctx, tx, conn.Config().RuntimeParams); err != nil {
		return Snapshot{}, 0, err
	}
	rule, err := readKeyRule(ctx, tx, rel, keyColumn, conn.Config().RuntimeParams, nil)
	if err != nil {
		return Snapshot{}, 0, err
	}
	rows, err := tx.Query(ctx, fmt.Sprintf("SELECT %s FROM %s", sanitizeColumns(columnsOf(keyColumn)), rel.from()), pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return Snapshot{}, 0, fmt.Errorf("postgres: read table %s: %w", rel, err)
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		text, ok, err := keyText(rule, rows.RawValues())
		if err != nil {
			return Snapshot{}, n, err
		}
		if !ok {
			continue // a NULL in a key of several columns: no key
		}
		if err := add(text); err != nil {
			return Snapshot{}, n, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return Snapshot{}, n, fmt.Errorf("postgres: read table %s: %w", rel, err)
	}
	return sn, n, nil
}
