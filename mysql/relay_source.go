package mysql

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
)

// A relaySource streams the committed changes of several tables of the
// DSN's database from the binlog, for a relay that passes them on
// (follow.Source): one binlog stream, whatever the number of tables and
// of replicas behind the relay. Each session:
//
//   - checks the server (binlog_format=ROW, binlog_row_image=FULL,
//     binlog_row_metadata=FULL: a row's key is found by its column's name
//     in the binlog's own table map, never by an ordinal that DDL may have
//     shifted while the relay lagged) and each table's key column;
//   - starts from the place the relay saved in cuckooguard_relay, if the
//     server is the same (server_id), still holds that binlog file at
//     least that long, and its GTID position is not behind the saved one;
//     otherwise from the binlog's end, as a reset (the followers read the
//     tables again);
//   - passes on each transaction that changed a table, once it is visible
//     (see relayStream.hold), with its tags and the control rows of
//     relayed followers; DDL that names a table, and a transaction of
//     more than maxTxKeys keys, make the table's changes incomplete (its
//     followers read it again);
//   - writes its own heartbeat row every heartbeat, and ends when nothing
//     arrives on the stream for the deadline while one is out, or when
//     one comes back with another identity of a table than the session's.
type relaySource struct {
	d          *relayed
	name       string
	tables     []follow.Table
	serverID   uint32
	heartbeat  time.Duration
	deadline   time.Duration
	backoff    time.Duration
	maxBackoff time.Duration
	log        *slog.Logger

	acked    atomic.Uint64 // what the handler confirmed
	state    atomic.Bool   // a session streams
	sessions atomic.Int64
	failures atomic.Int64
	commits  atomic.Int64
	waits    atomic.Int64 // commits held until a probe returned
	lastErr  atomic.Pointer[error]
	recheck  atomic.Bool // send a heartbeat now (Recheck)

	// unreadable is the saved place whose stream failed before its first
	// transaction (error 1236: purged, or not at an event of this
	// history), or later on an event that cannot be decoded; startPoint
	// does not start there again. Run's goroutine only.
	unreadable string
}

var _ follow.Source = (*relaySource)(nil)

func (d *relayed) Source(name string, tables []follow.Table, c follow.SourceConfig) (follow.Source, error) {
	switch {
	case name == "" || len(tables) == 0:
		return nil, errors.New("mysql: Source needs a name and at least one table")
	case c.Heartbeat <= 0 || c.Deadline <= c.Heartbeat || c.Backoff <= 0:
		return nil, fmt.Errorf("mysql: Source: heartbeat %v and backoff %v must be positive, and the deadline %v longer than the heartbeat", c.Heartbeat, c.Backoff, c.Deadline)
	}
	seen := map[string]bool{}
	for _, t := range tables {
		if !validName.MatchString(t.Table) || !validName.MatchString(t.Key) {
			return nil, fmt.Errorf("%w: table %q and key column %q must be plain names (letters, digits, _ and $) of the DSN's database", ErrSetup, t.Table, t.Key)
		}
		if t.Table == controlTable || t.Table == relayTable || t.Table == d.tagTable || seen[t.Table] {
			return nil, fmt.Errorf("%w: table %s cannot be relayed (a table of the relay's own, or named twice)", ErrSetup, t.Table)
		}
		seen[t.Table] = true
	}
	id := d.serverID
	if id == 0 {
		id = randomServerID()
	}
	log := cmp.Or(c.Logger, discardLogger)
	return &relaySource{d: d, name: name, tables: append([]follow.Table(nil), tables...), serverID: id,
		heartbeat: c.Heartbeat, deadline: c.Deadline, backoff: c.Backoff, maxBackoff: max(c.MaxBackoff, c.Backoff),
		log: log.With(slog.Group("cuckooguard", slog.String("relay", name)))}, nil
}

// Confirm tells the Source that everything it streamed up to pos is
// durable downstream: it saves its place there (at most every heartbeat).
func (s *relaySource) Confirm(pos uint64) {
	for {
		cur := s.acked.Load()
		if pos <= cur || s.acked.CompareAndSwap(cur, pos) {
			return
		}
	}
}

// Recheck makes the session write its heartbeat at once: it comes back
// with the identities of the tables as its statement saw them, and the
// session ends if one is another than the session's.
func (s *relaySource) Recheck() { s.recheck.Store(true) }

func (s *relaySource) Stats() follow.SourceStats {
	st := follow.SourceStats{Streaming: s.state.Load(), Sessions: s.sessions.Load(), Failures: s.failures.Load(),
		Commits: s.commits.Load(), Confirmed: s.acked.Load(), VisibilityWaits: s.waits.Load()}
	if e := s.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// Run streams until ctx ends, reconnecting with backoff after failures,
// and returns ctx's error. It returns at once an error wrapping ErrSetup
// or ErrKeyType if its first session finds a setup that cannot work;
// later sessions retry.
func (s *relaySource) Run(ctx context.Context, h follow.Handler) error {
	if ctx == nil || h == nil {
		return errors.New("mysql: Source.Run needs a context and a handler")
	}
	delay := s.backoff
	var logged string
	for first := true; ; first = false {
		streamed, err := s.session(ctx, h)
		s.state.Store(false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if first && s.d.Permanent(err) {
			return err
		}
		s.failures.Add(1)
		s.lastErr.Store(&err)
		if streamed > s.deadline || errors.Is(err, errTableChanged) {
			delay, logged = s.backoff, ""
		}
		d := delay/2 + rand.N(delay/2+1)
		if errors.Is(err, errTableChanged) {
			d = 0
		}
		delay = min(2*delay, s.maxBackoff)
		if msg := err.Error(); msg != logged {
			logged = msg
			s.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: relay's binlog stream ended; it reconnects",
				slog.Any("error", err), slog.Duration("retry_in", d))
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
