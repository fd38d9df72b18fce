package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// A transaction is decoded, and a Source passes it on, as soon as its
// commit record is flushed; it becomes visible to other sessions' snapshots
// only when its backend leaves the list of running transactions, which a
// committing backend under synchronous replication does only once the
// standbys answered. A reader that takes a snapshot after it learned of a
// commit from the relay (the fanout follower's read of the table) would
// miss that commit's rows. So a Source passes a commit that changed a
// table on only once a snapshot taken after it was decoded sees it: what
// the handler gets is visible to every snapshot taken afterwards.

// visibility waits for decoded transactions to become visible, on a
// connection of its own.
type visibility struct {
	s     *Source
	conn  *pgx.Conn
	seen  Snapshot // the newest snapshot taken; what it sees, every later one sees
	valid bool
}

// wait returns once transaction xid (decoded, committed) is visible to new
// snapshots, or ctx ends. It asks the server only when the last snapshot it
// took does not see xid already, and waits 1 ms, doubling to 50 ms, between
// asks; a wait longer than the heartbeat deadline is logged once.
func (v *visibility) wait(ctx context.Context, xid uint32) error {
	if v.valid && v.seen.VisibleXid(xid) {
		return nil
	}
	begin := time.Now()
	logged := false
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		var text string
		qctx, cancel := context.WithTimeout(ctx, v.s.deadline)
		err := v.conn.QueryRow(qctx, `SELECT pg_current_snapshot()::text`).Scan(&text)
		cancel()
		if err != nil {
			return failed(reasonFor(err, ReasonConnectionLost), fmt.Errorf("postgres: relay: read a snapshot: %w", err))
		}
		sn, err := ParseSnapshot(text)
		if err != nil {
			return failed(ReasonNotification, err)
		}
		v.seen, v.valid = sn, true
		if sn.VisibleXid(xid) {
			if logged {
				v.s.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: relay: the transaction it waited for is visible; it streams on",
					slog.Uint64("xid", uint64(xid)), slog.Duration("waited", time.Since(begin).Round(time.Millisecond)))
			}
			return nil
		}
		v.s.visibilityWaits.Add(1)
		if !logged && time.Since(begin) > v.s.deadline {
			logged = true
			v.s.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: relay: a committed transaction is not visible yet (a commit waiting for a synchronous standby?); the relay holds it and everything after it back until it is",
				slog.Uint64("xid", uint64(xid)), slog.Duration("waited", time.Since(begin).Round(time.Millisecond)))
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
