package mysql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/zeebo/xxh3"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// session is one stream's worth of following.
type session[K comparable] struct {
	f          *Follower[K]
	at         gomysql.Position // where the stream started
	src        source           // the server, as the session found it
	col        column
	hbOrdinal  int
	tagOrdinal int // of the tag table's tag column; -1: no tag table
	token      string
	following  *time.Time

	// Where the stream is: the binlog file, the GTID position after the
	// last transaction applied, and the transaction open now: where it
	// began, its GTID, and a hash of its events (resume.go).
	verify  *resumePoint // the transaction the stream must begin with; nil once it has
	file    string
	pos     gtidPos
	txFile  string
	txStart uint32
	txGTID  gtid
	txSeen  bool // a GTID event has begun a transaction in this stream
	hash    *xxh3.Hasher

	creations, deletions []K
	beats                []string // heartbeat payloads of the open transaction
	tags                 []string // tags of the open transaction (tag.go)
	overflow             bool     // the open transaction held more than maxTxKeys keys

	// Deletions wait until the server has made them visible (visible.go):
	// the Follower holds them (holds), across sessions.
	marks []mark        // this session's markers and heartbeats back, after holds.held[:upto]
	acked *atomic.Int64 // the seq of the last marker (0) or heartbeat whose write returned; -1: none

	seq        int64
	out        []beat // heartbeats sent and not back, oldest first
	markerSent time.Time
	last       time.Time // when anything last arrived on the stream
	next       time.Time // the next heartbeat is due
}

// run sends the marker and the heartbeats through hb, and applies the
// stream until an error.
func (s *session[K]) run(ctx context.Context, stream *replication.BinlogStreamer, hb *client.Conn, stmt *client.Stmt) error {
	f := s.f
	loop, end := context.WithCancelCause(ctx)
	defer end(nil)
	send := func(payload string) error {
		_ = hb.SetDeadline(time.Now().Add(f.deadline))
		_, err := stmt.Execute(f.serverID, payload)
		return err
	}
	s.acked = new(atomic.Int64)
	s.acked.Store(-1)
	s.markerSent = time.Now() // before: what commits before the marker committed before it
	if err := send("S " + s.token); err != nil {
		return fmt.Errorf("mysql: write the marker: %w", privilege(err))
	}
	s.acked.Store(0)
	s.last, s.next = s.markerSent, s.markerSent.Add(f.heartbeat)
	// The heartbeats go from a goroutine of their own: a write to a
	// silent connection blocks until its deadline, and the stream must be
	// watched meanwhile.
	beats := make(chan int64, 1) // the seq of the heartbeat to write
	var senders sync.WaitGroup
	senders.Go(func() {
		for {
			select {
			case <-loop.Done():
				return
			case seq := <-beats:
				if err := send(s.heartbeat(seq)); err != nil {
					end(fmt.Errorf("mysql: write a heartbeat: %w", err))
					return
				}
				// Returned: the server has made it visible, and with it
				// every transaction before it in the binlog.
				s.acked.Store(seq)
			}
		}
	})
	defer func() {
		end(nil)
		_ = hb.SetDeadline(time.Now()) // a write in progress fails now
		senders.Wait()
	}()
	for {
		wake := s.next
		if d := s.last.Add(f.deadline + time.Millisecond); d.Before(wake) {
			wake = d
		}
		if d := time.Now().Add(time.Millisecond); len(s.marks) > 0 && d.Before(wake) {
			// A heartbeat is back and its write has not returned yet
			// (usually a matter of microseconds): look again soon, to
			// release the deletes it covers (visible.go).
			wake = d
		}
		wctx, cancel := context.WithDeadline(loop, wake)
		ev, err := stream.GetEvent(wctx)
		cancel()
		now := time.Now()
		switch {
		case loop.Err() != nil:
			return context.Cause(loop)
		case errors.Is(err, context.DeadlineExceeded):
		case err != nil:
			err = streamError(err, s.at, f.serverID)
			if s.verify != nil && errors.Is(err, errUndecodable) {
				// Resumed inside a transaction of another history: a rows
				// event whose table map was before the place. Read the
				// table now, without the delay of a failed session.
				return fmt.Errorf("%w: the stream from the place resumed from fails: %w", errHistory, err)
			}
			return err
		default:
			s.last = now
			if err := s.event(ev, now); err != nil {
				return err
			}
		}
		if err := s.tick(now, beats); err != nil {
			return err
		}
	}
}

// tick ends the session if nothing has arrived for the deadline while the
// marker or a heartbeat is out, and hands the next heartbeat to the
// sender when it is due.
func (s *session[K]) tick(now time.Time, beats chan<- int64) error {
	f := s.f
	waiting := len(s.out) > 0 || State(f.state.Load()) == Resyncing
	if waiting && now.Sub(s.last) > f.deadline {
		return fmt.Errorf("mysql: nothing arrived on the binlog stream for %v with a heartbeat out: the connection is dead", now.Sub(s.last).Round(time.Millisecond))
	}
	if !now.Before(s.next) {
		select {
		case beats <- s.seq + 1:
			s.seq++
			s.out = append(s.out, beat{seq: s.seq, sent: now})
			f.beats.Add(1)
		default: // the last one is still being written: it is out, and ages
		}
		s.next = now.Add(f.heartbeat)
	}
	return s.release()
}

// event handles one binlog event.
func (s *session[K]) event(ev *replication.BinlogEvent, now time.Time) error {
	switch e := ev.Event.(type) {
	case *replication.RotateEvent:
		s.file = string(e.NextLogName)
		return nil
	case *replication.MariadbGTIDEvent:
		if len(s.creations)+len(s.deletions)+len(s.beats) > 0 || s.overflow {
			return errors.New("mysql: a transaction began before the last one committed")
		}
		s.txSeen, s.txFile, s.txStart = true, s.file, ev.Header.LogPos-ev.Header.EventSize
		s.txGTID = gtid{domain: e.GTID.DomainID, server: e.GTID.ServerID, seq: e.GTID.SequenceNumber}
		s.hash.Reset()
		_, _ = s.hash.Write(ev.RawData)
		if v := s.verify; v != nil && (s.txFile != v.file || s.txStart != v.start) {
			return fmt.Errorf("%w: the stream's first transaction begins at %s:%d, the last one applied began at %s:%d", errHistory, s.txFile, s.txStart, v.file, v.start)
		}
		return nil
	case *replication.GTIDEvent:
		return errors.New("mysql: a MySQL GTID event: only MariaDB is supported")
	}
	if s.txSeen {
		_, _ = s.hash.Write(ev.RawData)
	}
	if s.verify != nil {
		return s.verifying(ev)
	}
	switch e := ev.Event.(type) {
	case *replication.RowsEvent:
		return s.rows(ev.Header.EventType, e)
	case *replication.XIDEvent:
		return s.commit(now, ev.Header.LogPos)
	case *replication.QueryEvent:
		return s.query(string(e.Query), now, ev.Header.LogPos)
	}
	return nil
}

// verifying handles an event of a resumed stream before its first
// transaction has proved to be the last one the Follower applied: that
// transaction is not applied again, and anything else ends the session
// with errHistory, for a full read.
func (s *session[K]) verifying(ev *replication.BinlogEvent) error {
	end := false
	switch e := ev.Event.(type) {
	case *replication.XIDEvent:
		end = true
	case *replication.QueryEvent:
		end = strings.EqualFold(strings.TrimSpace(string(e.Query)), "COMMIT")
		if !end && !s.txSeen {
			return fmt.Errorf("%w: the stream begins with a statement, not the transaction last applied", errHistory)
		}
	case *replication.RowsEvent, *replication.TableMapEvent:
		if !s.txSeen {
			return fmt.Errorf("%w: the stream begins with rows outside a transaction", errHistory)
		}
	}
	if !end {
		return nil
	}
	v := s.verify
	if !s.txSeen || s.txFile != v.file || s.txStart != v.start || ev.Header.LogPos != v.end || s.txGTID != v.gtid || s.hash.Sum64() != v.sum {
		return fmt.Errorf("%w: the binlog holds transaction %v at %s:%d-%d (hash %x), the follower applied %v at %s:%d-%d (hash %x)",
			errHistory, s.txGTID, s.txFile, s.txStart, ev.Header.LogPos, s.hash.Sum64(), v.gtid, v.file, v.start, v.end, v.sum)
	}
	s.verify = nil
	s.f.resumes.Add(1)
	s.f.log.LogAttrs(context.Background(), slog.LevelInfo, "cuckooguard: follower resumed without reading the table", slog.String("position", v.String()))
	return nil
}

// query handles a statement the binlog carries as text: a transaction's
// BEGIN and COMMIT (for engines without XA), DDL, and the writes of a
// session in STATEMENT or MIXED format.
func (s *session[K]) query(q string, now time.Time, end uint32) error {
	q = strings.TrimSpace(q)
	upper := strings.ToUpper(q)
	switch {
	case upper == "BEGIN":
		return nil
	case upper == "COMMIT":
		return s.commit(now, end)
	case upper == "ROLLBACK":
		// A transaction that wrote a non-transactional table: its
		// transactional rows were rolled back.
		s.creations, s.deletions, s.beats, s.tags, s.overflow = s.creations[:0], s.deletions[:0], s.beats[:0], s.tags[:0], false
		return nil
	case strings.HasPrefix(upper, "XA ") || strings.HasPrefix(upper, "SAVEPOINT") || strings.HasPrefix(upper, "ROLLBACK TO"):
		if len(s.creations)+len(s.deletions) > 0 || strings.HasPrefix(upper, "XA COMMIT") {
			return fmt.Errorf("%w: %.60s: the follower does not follow XA transactions or savepoints in the binlog", errTableChanged, q)
		}
		return nil
	case strings.Contains(strings.ToLower(q), strings.ToLower(s.col.table)),
		strings.HasPrefix(upper, "DROP DATABASE"), strings.HasPrefix(upper, "DROP SCHEMA"),
		// A write in statement format may change the table without naming
		// it (through a view, a trigger, a procedure).
		statementWrite(upper):
		// DDL on the table (ALTER, RENAME, DROP, CREATE, TRUNCATE), or a
		// write in statement format: its rows are not in the binlog.
		// Read the table again. (A statement that only names the table
		// in passing costs a read, never a key.)
		if statementWrite(upper) {
			return fmt.Errorf("%w: a write logged as a statement (a session's binlog_format is not ROW): %.80s", errTableChanged, q)
		}
		return fmt.Errorf("%w: %.80s", errTableChanged, q)
	}
	return nil
}

// rows holds the keys of a rows event of the table until its commit, and
// the heartbeats of the heartbeat table.
func (s *session[K]) rows(t replication.EventType, e *replication.RowsEvent) error {
	if string(e.Table.Schema) != s.col.schema {
		return nil
	}
	switch string(e.Table.Table) {
	case s.col.table:
	case s.f.hbTable:
		return s.heartbeatRows(t, e)
	case s.f.tagTable:
		return s.tagRows(t, e)
	default:
		return nil
	}
	if int(e.Table.ColumnCount) != s.col.columns {
		return fmt.Errorf("%w: the binlog's rows have %d columns, the table had %d", errTableChanged, e.Table.ColumnCount, s.col.columns)
	}
	key := func(row []any) (K, bool, error) {
		var zero K
		if s.col.ordinal >= len(row) {
			return zero, false, fmt.Errorf("mysql: a row of %d columns has no key column %d", len(row), s.col.ordinal)
		}
		text, ok, err := s.f.form.fromRow(row[s.col.ordinal])
		if err != nil {
			return zero, false, err
		}
		if !ok {
			// The key column is NOT NULL (followable): nil is a row image
			// without it, which a session's binlog_row_image other than
			// FULL writes. Its key is not in the binlog: read the table.
			return zero, false, fmt.Errorf("%w: a row image of the table without its key column (a session's binlog_row_image is not FULL)", errTableChanged)
		}
		k, err := s.f.parse(text)
		if err != nil {
			return zero, false, fmt.Errorf("mysql: parse key %q of %s: %w", text, s.col.name, err)
		}
		return k, true, nil
	}
	hold := func(into *[]K, row []any) error {
		k, ok, err := key(row)
		if err != nil || !ok {
			return err
		}
		if s.overflow {
			return nil
		}
		if len(s.creations)+len(s.deletions) >= maxTxKeys {
			s.creations, s.deletions, s.overflow = nil, nil, true
			return nil
		}
		*into = append(*into, k)
		return nil
	}
	switch kindOf(t) {
	case insertRows:
		for _, row := range e.Rows {
			if err := hold(&s.creations, row); err != nil {
				return err
			}
		}
	case deleteRows:
		for _, row := range e.Rows {
			if err := hold(&s.deletions, row); err != nil {
				return err
			}
		}
	case updateRows:
		if len(e.Rows)%2 != 0 {
			return errors.New("mysql: an update event without an after image for each row")
		}
		for i := 0; i < len(e.Rows); i += 2 {
			before, okB, err := key(e.Rows[i])
			if err != nil {
				return err
			}
			after, okA, err := key(e.Rows[i+1])
			if err != nil {
				return err
			}
			if okB == okA && before == after {
				continue // the key did not change
			}
			if okB {
				if err := hold(&s.deletions, e.Rows[i]); err != nil {
					return err
				}
			}
			if okA {
				if err := hold(&s.creations, e.Rows[i+1]); err != nil {
					return err
				}
			}
		}
	default:
		return fmt.Errorf("mysql: rows event %v of the table is not understood", t)
	}
	return nil
}

// heartbeatRows holds the payloads of this session's heartbeat row.
func (s *session[K]) heartbeatRows(t replication.EventType, e *replication.RowsEvent) error {
	first, step := 0, 1
	switch kindOf(t) {
	case insertRows:
	case updateRows:
		first, step = 1, 2 // the after images
	default:
		return nil
	}
	for i := first; i < len(e.Rows); i += step {
		row := e.Rows[i]
		if s.hbOrdinal >= len(row) {
			continue
		}
		if p, ok := row[s.hbOrdinal].(string); ok && strings.Contains(p, s.token) {
			s.beats = append(s.beats, strings.Clone(p))
		}
	}
	return nil
}

// tagRows holds the tags of the open transaction: the tag table's
// inserted rows (their deletion, in the same transaction, is no tag).
func (s *session[K]) tagRows(t replication.EventType, e *replication.RowsEvent) error {
	if kindOf(t) != insertRows || s.tagOrdinal < 0 {
		return nil
	}
	for _, row := range e.Rows {
		if s.tagOrdinal >= len(row) {
			continue
		}
		switch v := row[s.tagOrdinal].(type) {
		case []byte:
			s.tags = append(s.tags, string(v))
		case string:
			s.tags = append(s.tags, strings.Clone(v))
		}
	}
	return nil
}

// commit applies the open transaction, which ends at end in the binlog:
// its creations at once, its deletions once the server has made them
// visible (after the creations, so a key created and deleted in it is
// never removed before it is added), and its heartbeats. The guard then
// reflects the binlog up to end: the next session may resume there.
func (s *session[K]) commit(now time.Time, end uint32) error {
	if s.overflow {
		return fmt.Errorf("%w: more than %d keys", errBigTransaction, maxTxKeys)
	}
	f := s.f
	// The creations first: a held deletion of one of their keys, an
	// earlier transaction's, is cancelled by it; this transaction's own
	// deletions are held after them.
	own := f.own(s.tags)
	for _, k := range s.creations {
		if own[k] > 0 {
			// This process's Loader added the key before the write.
			own[k]--
			f.skipped.Add(1)
			if f.holds.cancel(k) {
				// The Loader added this creation's copy: the held
				// deletion it cancels takes one copy now.
				if err := s.apply(guarded.Change[K]{Key: k, Deleted: true}); err != nil {
					return err
				}
			}
			continue
		}
		if err := s.create(k); err != nil {
			return err
		}
	}
	clear(s.tags)
	s.tags = s.tags[:0]
	if len(f.holds.held)+len(s.deletions) > maxTxKeys {
		return fmt.Errorf("%w: more than %d deletions wait to be visible", errBigTransaction, maxTxKeys)
	}
	f.holds.hold(s.deletions)
	clear(s.creations)
	clear(s.deletions)
	s.creations, s.deletions = s.creations[:0], s.deletions[:0]
	for _, p := range s.beats {
		if seq, ok := s.control(p, now); ok {
			s.marks = append(s.marks, mark{seq: seq, upto: len(f.holds.held)})
		}
	}
	s.beats = s.beats[:0]
	if err := s.release(); err != nil {
		return err
	}
	s.applied(end)
	if s.txSeen && s.txGTID.domain == f.tokDomain {
		f.reachAfter(s.txGTID.seq) // lookups under a token up to it wait no longer (token.go)
	}
	f.maybeSave(now)
	return nil
}

// applied records that the guard reflects the binlog up to end, the end
// of the open transaction: the next session may resume from there.
func (s *session[K]) applied(end uint32) {
	if !s.txSeen {
		return // no GTID event began it: nothing to prove the position by
	}
	s.pos[s.txGTID.domain] = s.txGTID
	p := s.f.resume
	if p == nil {
		p = &resumePoint{serverID: s.src.serverID, col: s.col, pos: s.pos}
		s.f.resume = p
	}
	p.file, p.start, p.end, p.gtid, p.sum = s.txFile, s.txStart, end, s.txGTID, s.hash.Sum64()
}

type rowsKind int

const (
	otherRows rowsKind = iota
	insertRows
	deleteRows
	updateRows
)

// kindOf says what a rows event's type does.
func kindOf(t replication.EventType) rowsKind {
	switch t {
	case replication.WRITE_ROWS_EVENTv0, replication.WRITE_ROWS_EVENTv1, replication.WRITE_ROWS_EVENTv2,
		replication.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1:
		return insertRows
	case replication.DELETE_ROWS_EVENTv0, replication.DELETE_ROWS_EVENTv1, replication.DELETE_ROWS_EVENTv2,
		replication.MARIADB_DELETE_ROWS_COMPRESSED_EVENT_V1:
		return deleteRows
	case replication.UPDATE_ROWS_EVENTv0, replication.UPDATE_ROWS_EVENTv1, replication.UPDATE_ROWS_EVENTv2,
		replication.MARIADB_UPDATE_ROWS_COMPRESSED_EVENT_V1, replication.PARTIAL_UPDATE_ROWS_EVENT:
		return updateRows
	}
	return otherRows
}
