package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A stream that delivers nothing is either dead or busy: the server may
// be decoding a bulk load (of this table, or of a table nobody follows)
// before it can send the next change, the heartbeat behind it. Calling
// a busy connection dead and reconnecting makes the new session decode
// the same WAL from the same point, and a follower can loop like that for
// as long as the bulk load takes to decode, every replica at once. So a
// follower asks, with every heartbeat it sends, what its walsender is
// doing (walsenderQuery), and a stream that has delivered nothing for the
// heartbeat deadline is dead only if the walsender is not at work: idle
// (it sent everything, which never arrived), blocked writing to this
// follower, or gone. While it works the follower is behind: its Loader
// passes lookups through, as whenever it lags, and it says how much WAL is
// left to decode.

// walsender is what the server said of a session's walsender when a
// heartbeat was sent.
type walsender struct {
	at      time.Time     // when the heartbeat that asked was sent
	working bool          // decoding or reading WAL: neither idle, nor blocked writing to this follower, nor gone
	wait    string        // its wait event ("type/event"), "" while on the CPU
	sent    pglogrepl.LSN // how far it has decoded the WAL
	behind  int64         // bytes of WAL it has yet to decode
	worked  time.Time     // when it was last found at work, by this heartbeat or an earlier one
	snap    Snapshot      // the heartbeat's own snapshot: which transactions were visible when it ran (apply.go's deletions)
}

// walsenderQuery is appended to a heartbeat's statement (emit): the wait
// event of the walsender of pid $5 (NULL on the CPU), how far it has
// decoded, the end of the WAL, and the statement's snapshot, as one row
// with the heartbeat.
const walsenderQuery = `, a.pid IS NOT NULL, coalesce(a.wait_event_type || '/' || a.wait_event, ''),
	coalesce(r.sent_lsn, '0/0')::text, pg_current_wal_lsn()::text, pg_current_snapshot()::text
	FROM (SELECT) x LEFT JOIN pg_stat_activity a ON a.pid = $5 LEFT JOIN pg_stat_replication r ON r.pid = $5`

// scanWalsender reads the columns of walsenderQuery from row, for the
// heartbeat sent at at; prev is what the last one said.
func scanWalsender(row pgx.Row, at time.Time, prev *walsender) (*walsender, error) {
	var found bool
	var wait, sent, end, snap string
	if err := row.Scan(nil, &found, &wait, &sent, &end, &snap); err != nil {
		return nil, err
	}
	w := &walsender{at: at, wait: wait}
	var err error
	if w.snap, err = ParseSnapshot(snap); err != nil {
		return nil, err
	}
	if w.sent, err = pglogrepl.ParseLSN(sent); err != nil {
		return nil, err
	}
	e, err := pglogrepl.ParseLSN(end)
	if err != nil {
		return nil, err
	}
	w.behind = max(int64(e)-int64(w.sent), 0)
	advanced := prev != nil && w.sent > prev.sent
	typ, _, _ := strings.Cut(wait, "/")
	switch {
	case !found:
		w.working = false // gone
	case wait == "":
		w.working = true // on the CPU
	case wait == "Client/WalSenderWriteData":
		w.working = false // blocked writing to this follower, which does not read
	case advanced:
		// Waiting for the WAL of a load that its writer has not flushed
		// yet, between bursts of decoding it: at work.
		w.working = true
	default:
		// Activity (WalSenderMain) and Client (WalSenderWaitForWAL, with
		// nothing decoded since the last heartbeat) are idle: it sent
		// everything. IO (reading WAL or spilled transactions), locks and
		// the rest are work.
		w.working = typ != "Activity" && typ != "Client"
	}
	switch {
	case w.working:
		w.worked = at
	case prev != nil:
		w.worked = prev.worked
	}
	return w, nil
}

// busy reports whether the session's walsender was found at work within
// a heartbeat and the heartbeat deadline before now: the heartbeats ask
// every heartbeat, and each may take up to the deadline to be answered
// (one that takes longer ends the session). A walsender that has just
// finished decoding sends what it decoded at once: the time after its
// last sighting at work leaves the stream that long to arrive. The first
// time in an episode busy logs how much WAL the server has yet to decode.
func (f *Follower[K]) busy(ctx context.Context, s *session, now time.Time) bool {
	if s.walsender == nil {
		return false // NOTIFY: no walsender
	}
	w := s.walsender.Load()
	if w == nil || w.worked.IsZero() || now.Sub(w.worked) > f.heartbeat+f.deadline {
		return false
	}
	f.decodingBehind.Store(w.behind)
	if s.busySince.IsZero() {
		s.busySince = now
		f.busyWaits.Add(1)
		f.behindSince.Store(now.UnixNano())
		f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower is behind: the server is still decoding WAL before it can send the table's next change; lookups pass through until it catches up",
			slog.Int64("decoding_bytes", w.behind), slog.String("walsender_wait", w.wait), slog.Duration("silent_for", now.Sub(s.hb.last).Round(time.Millisecond)))
	}
	return true
}

// caughtUp ends a busy episode of s when the stream delivers again, and
// logs how long it lasted.
func (f *Follower[K]) caughtUp(ctx context.Context, s *session, now time.Time) {
	if s.busySince.IsZero() {
		return
	}
	f.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: follower's stream delivers again after the server decoded its backlog",
		slog.Duration("behind_for", now.Sub(s.busySince).Round(time.Millisecond)))
	s.busySince = time.Time{}
	f.decodingBehind.Store(0)
	f.behindSince.Store(0)
}

// reasonFor returns the Reason of a session that ended with err from the
// connection: the server ending it by an administrator's command or a
// shutdown (SQLSTATE class 57: pg_terminate_backend, pg_ctl stop or
// restart) is ReasonTerminated, a timeout (nothing answered within the
// deadline) is timeout, and anything else ReasonConnectionLost.
func reasonFor(err error, timeout Reason) Reason {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && len(pgErr.Code) == 5 && pgErr.Code[:2] == "57":
		return ReasonTerminated
	case pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded):
		return timeout
	}
	return ReasonConnectionLost
}

// releaseSlot frees slot, held by pid, the walsender of this process's
// last session, which may still be decoding after the session gave up on
// it: it is ended, and the slot waited for for up to timeout.
func releaseSlot(ctx context.Context, c *pgx.Conn, slot string, pid int64, timeout time.Duration) error {
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		return fmt.Errorf("postgres: end the last session's walsender (pid %d): %w", pid, err)
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		st, err := readSlot(ctx, c, slot)
		if err != nil {
			return err
		}
		if !st.active {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres: slot %s stays held by pid %d", slot, st.activePID)
		}
	}
}

// walsenderSays describes, for an error, what the last heartbeat learned
// of the session's walsender at now.
func (f *Follower[K]) walsenderSays(s *session, now time.Time) string {
	if s.walsender == nil {
		return ""
	}
	w := s.walsender.Load()
	switch {
	case w == nil:
		return "; nothing is known of the walsender yet"
	case now.Sub(w.at) > f.heartbeat+f.deadline:
		return fmt.Sprintf("; the server has not answered a heartbeat for %v", now.Sub(w.at).Round(time.Millisecond))
	case w.working:
		return fmt.Sprintf("; the walsender works (%s), %d bytes of WAL to decode", cmp.Or(w.wait, "on the CPU"), w.behind)
	case w.wait == "":
		return "; the walsender is gone"
	}
	return fmt.Sprintf("; the walsender is not at work (%s), %d bytes of WAL to decode", w.wait, w.behind)
}
