package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// errTruncated ends a session after a TRUNCATE of the table: the guard
// holds keys that are gone, and only a full read removes them.
var errTruncated = errors.New("postgres: the table was truncated")

// errBigTransaction ends a session after a transaction that deleted more
// keys than it holds back: the guard holds keys that are gone.
var errBigTransaction = errors.New("postgres: a transaction deleted more keys than the follower holds back")

// statusEvery is how often a session confirms its position to the server,
// at the least; the server also asks, and gives up a client that stays
// silent for wal_sender_timeout (60 s by default).
const statusEvery = 5 * time.Second

// nap is how long a session waits, while the stream is busy, before it
// reads the stream again: the changes that arrive meanwhile come in one
// read, not one read and one wake-up each, which cost more CPU than
// applying them. It is at most the delay it adds to a change.
const nap = time.Millisecond

// noteEvery is how often a session records in cuckooguard_slots that it
// uses its slot, and reads how much WAL the slot holds.
const noteEvery = 30 * time.Second

// testHookBeforeStart, if set, runs between a session's decision of where
// its stream starts and START_REPLICATION, with the slot's name.
var testHookBeforeStart func(slot string)

// followLogical is one session of a logical-decoding follower:
//  1. check the setup, and read the publication's version;
//  2. decide where the stream starts (decide), and make the guard reflect
//     exactly the changes before that point: as it is (resume), from the
//     snapshot file (restore), or from a full read (readAll);
//  3. start streaming, and check that the server started where it was
//     asked (verifyStart);
//  4. send the marker, and apply the stream until the session ends,
//     saving the guard, confirming positions and sending heartbeats.
//
// It sets *following when the marker comes back.
func (f *Follower[K]) followLogical(ctx context.Context, following *time.Time) error {
	sender, err := f.dial.connect(ctx, "read") // checks, the read, heartbeats, the slot's record
	if err != nil {
		return err
	}
	defer sender.Close(context.WithoutCancel(ctx))
	rel, pub, err := f.checkSetup(ctx, sender)
	if err != nil {
		return err
	}
	rc, err := f.dial.connectStream(ctx)
	if err != nil {
		return err
	}
	defer rc.Close(context.WithoutCancel(ctx))
	f.pid.Store(rc.PID())
	defer func() { f.lastStream = rc.PID() }()
	f.state.Store(int32(Resyncing))
	sys, err := pglogrepl.IdentifySystem(ctx, rc)
	if err != nil {
		return failed(ReasonConnectionLost, fmt.Errorf("postgres: follower: identify the system: %w", err))
	}
	id := slotID{system: sys.SystemID, database: sys.DBName}
	db, err := IdentifyDatabase(ctx, sender)
	if err != nil {
		return failed(ReasonConnectionLost, fmt.Errorf("postgres: follower: %w", err))
	}
	f.streamID = db.Token() // the stream of the positions the Loader reaches (WriteToken)
	if f.origin != "" {
		id.name = slotName(rel.schema, rel.name, f.origin)
	}
	slot, at, err := f.startPoint(ctx, sender, rc, id, rel, pub)
	if err != nil {
		return err
	}
	if id.name != "" {
		f.noteSlot(ctx, sender, rel, id.name)
	}
	if testHookBeforeStart != nil {
		testHookBeforeStart(slot)
	}
	err = pglogrepl.StartReplication(ctx, rc, slot, at, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'",
		// A list of identifiers: quoted, the name keeps its case and spaces.
		"publication_names " + quoteLiteral(pgx.Identifier{publicationName(rel.schema, rel.name)}.Sanitize()),
		"messages 'true'", // the tags, markers and heartbeats
	}})
	if err != nil {
		// Resuming from a position whose WAL is gone, say.
		f.require(ReadResumeFailed)
		return failed(ReasonListen, fmt.Errorf("postgres: follower: start streaming slot %s from %s: %w", slot, at, err))
	}
	if err := verifyStart(ctx, sender, slot, rc.PID(), at); err != nil {
		if errors.Is(err, errSlotMoved) {
			f.require(ReadSlotMoved)
		}
		return err
	}
	f.streamStarted()
	f.setApplied(at)
	err = f.stream(ctx, sender, rc, rel, pub, following)
	if reasonOf(err) == ReasonConnectionLost && ctx.Err() == nil {
		// A walsender ended by a shutdown closes its connection without a
		// word; the regular connection got the server's reason.
		if why := askWhy(ctx, sender); why != nil {
			err = failed(ReasonTerminated, fmt.Errorf("%w (the server: %w)", err, why))
		}
	}
	return err
}

// askWhy returns the server's error of connection c if it says the server
// ended it (SQLSTATE class 57: a shutdown, pg_terminate_backend), or nil.
func askWhy(ctx context.Context, c *pgx.Conn) error {
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := c.Exec(actx, "SELECT 1")
	if err != nil && reasonFor(err, "") == ReasonTerminated {
		return err
	}
	return nil
}

// checkSetup checks what logical decoding needs, on the regular
// connection, and returns the table and its publication's version.
func (f *Follower[K]) checkSetup(ctx context.Context, sender *pgx.Conn) (relation, string, error) {
	setup := func(err error) error {
		if errors.Is(err, ErrLogicalUnavailable) || errors.Is(err, ErrNotPublished) || errors.Is(err, ErrKeyNotIdentity) {
			return failed(ReasonSetup, err)
		}
		return failed(ReasonConnectionLost, err)
	}
	if err := checkServer(ctx, sender); err != nil {
		return relation{}, "", setup(err)
	}
	if err := checkReplication(ctx, sender); err != nil {
		return relation{}, "", setup(err)
	}
	rel, err := resolve(ctx, sender, f.table)
	if err != nil {
		return rel, "", failed(ReasonSetup, err)
	}
	if err := checkPublished(ctx, sender, rel, f.key); err != nil {
		return rel, "", setup(err)
	}
	pub, err := readPublicationVersion(ctx, sender, rel)
	if err != nil {
		return rel, "", setup(err)
	}
	if err := f.readRule(ctx, sender, rel); err != nil {
		return rel, "", err
	}
	return rel, pub, nil
}

// readRule reads the key column's forms for the session (the read and the
// stream) and for Key, before the session can make the Loader ready: a
// Key that returns a form is never one older than the guard's.
func (f *Follower[K]) readRule(ctx context.Context, c *pgx.Conn, rel relation) error {
	rule, err := readKeyRule(ctx, c, rel, f.key, f.dial.conf.RuntimeParams, cmp.Or(f.rule, f.tags.rule()))
	if err != nil {
		if errors.Is(err, ErrKeyType) {
			return failed(ReasonSetup, err)
		}
		return failed(ReasonConnectionLost, err)
	}
	f.rule = rule
	f.tags.setRule(rule)
	return nil
}

// startPoint decides where the session's stream starts (decide) and makes
// the guard reflect exactly the changes before it. It returns the slot to
// stream from and the position to stream from.
func (f *Follower[K]) startPoint(ctx context.Context, sender *pgx.Conn, rc *pgconn.PgConn, id slotID, rel relation, pub string) (string, pglogrepl.LSN, error) {
	var st slotState
	if id.name != "" {
		var err error
		if st, err = readSlot(ctx, sender, id.name); err != nil {
			return "", 0, failed(ReasonSlot, err)
		}
		if st.active && f.lastStream != 0 && st.activePID == int64(f.lastStream) {
			// This follower's last walsender, still at work (decoding a
			// bulk load, say) after its session ended: end it.
			if err := releaseSlot(ctx, sender, id.name, st.activePID, f.deadline); err != nil {
				return "", 0, failed(ReasonSlot, err)
			}
			if st, err = readSlot(ctx, sender, id.name); err != nil {
				return "", 0, failed(ReasonSlot, err)
			}
		}
		if st.active {
			return "", 0, failed(ReasonSlot, fmt.Errorf("postgres: follower: slot %s is in use by another connection (pid %d): does another process have the origin %q?", id.name, st.activePID, f.origin))
		}
		if st.exists {
			var err error
			if st.walEnd, err = readWALEnd(ctx, sender); err != nil {
				return "", 0, failed(ReasonConnectionLost, err)
			}
		}
	}
	s := decide(f.pending, id.name == "", f.snapPath != "", &f.pos, st, pub)
	switch s.how {
	case resume:
		return id.name, f.pos.applied, nil
	case restore:
		lsn, why := f.restore(ctx, id, st, pub)
		if why == "" {
			return id.name, lsn, nil
		}
		s.reason = why
	}
	return f.readAll(ctx, sender, rc, id, rel, pub, s.reason)
}

// stream applies the session's stream until the session ends: it sends
// the marker, then waits for messages and decodes them, between
// transactions saves the guard, confirms positions, and sends heartbeats.
func (f *Follower[K]) stream(ctx context.Context, sender *pgx.Conn, rc *pgconn.PgConn, rel relation, pub string, following *time.Time) error {
	lastNote := time.Now()
	var probe atomic.Pointer[walsender]
	s, err := f.startSession(ctx, newToken(), pub, following, func(ctx context.Context, payload string) error {
		if f.origin != "" && time.Since(lastNote) > noteEvery {
			// Best effort: a slot not noted for long may be dropped by
			// DropStaleSlots only while it is not active.
			lastNote = time.Now()
			name := slotName(rel.schema, rel.name, f.origin)
			f.noteSlot(ctx, sender, rel, name)
			if st, err := readSlot(ctx, sender, name); err == nil {
				f.retained.Store(st.retained)
			}
		}
		return f.emit(ctx, sender, rel, payload, rc.PID(), &probe)
	})
	if err != nil {
		return err
	}
	defer s.stop() // before sender closes (deferred earlier)
	s.walsender = &probe
	s.oid = strconv.FormatUint(uint64(rel.oid), 10)
	dec := newDecoder(decodedTable{schema: rel.schema, rel: rel.name, key: f.key, rule: f.rule})
	app := &applier[K]{f: f, s: s}
	var received pglogrepl.LSN // the end of what the server sent
	nextStatus := time.Now()
	noMarker := func(waited time.Duration) error {
		return failed(ReasonHeartbeatLost, fmt.Errorf("postgres: follower: the marker sent %v ago has not come back in the stream%s",
			waited.Round(time.Millisecond), f.walsenderSays(s, time.Now())))
	}
	// The stream is waited for with the socket's read deadline, not a
	// context per message: a context with a deadline, and pgconn's watch
	// of it, cost more CPU than applying the change. The session's end
	// interrupts a wait by moving the deadline to now.
	conn := rc.Conn()
	stopWatch := context.AfterFunc(s.loopCtx, func() { conn.SetReadDeadline(time.Now()) })
	defer stopWatch()
	busy := false // the last wait for the stream was shorter than a nap
	past := time.Unix(1, 0)
	for {
		if busy {
			time.Sleep(nap)
		}
		conn.SetReadDeadline(f.wake(&s.hb, s.next, time.Now()))
		waited := time.Now()
		msg, err := rc.ReceiveMessage(context.Background())
		now := time.Now()
		busy = err == nil && now.Sub(waited) < nap
		app.now = now
		for {
			if err := s.waitEnded(ctx, "receive", err); err != nil {
				return err
			}
			if err != nil {
				break
			}
			s.hb.last = now
			f.caughtUp(ctx, s, now)
			reply, herr := f.handle(msg, dec, app, &received)
			if herr != nil {
				return herr
			}
			if reply {
				nextStatus = now
			}
			// What the last read brought beyond this message: a read
			// whose deadline has passed returns at once, without asking
			// the socket, unless a message is buffered.
			conn.SetReadDeadline(past)
			msg, err = rc.ReceiveMessage(context.Background())
		}
		if err := app.release(); err != nil { // deletions whose transactions are visible now
			return err
		}
		if !dec.open {
			if err := f.maybeSave(ctx); err != nil {
				f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower could not save its guard", slog.Any("error", err))
			}
		}
		if !now.Before(nextStatus) {
			if err := f.status(ctx, rc, received); err != nil {
				return failed(reasonFor(err, ReasonConnectionLost), err)
			}
			nextStatus = now.Add(min(statusEvery, f.heartbeat))
		}
		if err := f.tick(s, now, noMarker); err != nil {
			return err
		}
	}
}

// handle handles one message of the replication connection: a keepalive,
// or a pgoutput message for the decoder. It reports whether the server
// asked for the session's position, and moves *received to the end of
// what the server has sent.
func (f *Follower[K]) handle(msg pgproto3.BackendMessage, dec *decoder, app *applier[K], received *pglogrepl.LSN) (reply bool, err error) {
	cd, ok := msg.(*pgproto3.CopyData)
	if !ok {
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			pgErr := pgconn.ErrorResponseToPgError(e)
			return false, failed(reasonFor(pgErr, ReasonConnectionLost), fmt.Errorf("postgres: follower stream: %w", pgErr))
		}
		return false, nil
	}
	if len(cd.Data) == 0 {
		return false, nil
	}
	switch cd.Data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
		if err != nil {
			return false, failed(ReasonNotification, err)
		}
		*received = max(*received, k.ServerWALEnd)
		if !dec.open {
			// Everything the server decoded before this was sent before
			// it: nothing of the table lies between the last transaction
			// applied and here. Moving past it lets the slot release WAL
			// while the table is quiet and others are busy.
			f.setApplied(k.ServerWALEnd)
		}
		return k.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return false, failed(ReasonNotification, err)
		}
		*received = max(*received, x.WALStart+pglogrepl.LSN(len(x.WALData)))
		if err := dec.decode(x.WALData, app); err != nil {
			var se *sessionError
			if errors.As(err, &se) || errors.Is(err, errTruncated) || errors.Is(err, errBigTransaction) {
				return false, err
			}
			return false, failed(ReasonNotification, err)
		}
	}
	return false, nil
}

// setApplied records that the guard reflects the changes up to lsn.
func (f *Follower[K]) setApplied(lsn pglogrepl.LSN) {
	f.pos.advance(lsn)
	f.appliedLSN.Store(uint64(f.pos.applied))
	if f.pos.valid {
		// Lookups under a token of a write committed before here wait no
		// longer (WriteToken).
		if tok, err := guarded.NewToken(f.streamID, uint64(f.pos.applied)); err == nil {
			f.feed.Reached(tok)
		}
	}
}

// status confirms the session's position to the server: what it
// received, what it may discard (position.confirmable), and what the
// guard reflects.
func (f *Follower[K]) status(ctx context.Context, rc *pgconn.PgConn, received pglogrepl.LSN) error {
	flush := f.pos.confirmable(f.snapPath != "")
	if flush == 0 {
		flush = 1 // pglogrepl takes 0 for "as written": never confirm more than is kept
	}
	sctx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	err := pglogrepl.SendStandbyStatusUpdate(sctx, rc, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(received, f.pos.applied),
		WALFlushPosition: flush,
		WALApplyPosition: f.pos.applied,
	})
	if err != nil {
		return fmt.Errorf("postgres: follower: confirm position: %w", err)
	}
	f.flushedLSN.Store(uint64(flush))
	return nil
}

// emit sends a marker or a heartbeat, payload, through c as a
// transactional logical decoding message, with the table's identity as
// this transaction sees it appended (identityExpr: the oid the
// Follower's table name resolves to, and the version of the publication
// of rel), within the heartbeat deadline: it comes back in the stream in
// its own transaction, in commit order. The same statement asks what the
// walsender of pid is doing (walsenderQuery), for *probe.
func (f *Follower[K]) emit(ctx context.Context, c *pgx.Conn, rel relation, payload string, pid uint32, probe *atomic.Pointer[walsender]) error {
	ectx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	sent := time.Now()
	q := `SELECT pg_logical_emit_message(true, $3, $4 || ' ' || ` + identityExpr(2, 1) + `)` + walsenderQuery
	row := c.QueryRow(ectx, q, publicationName(rel.schema, rel.name), sanitizeTable(f.table), controlPrefix, payload, int64(pid))
	w, err := scanWalsender(row, sent, probe.Load())
	if err != nil {
		return fmt.Errorf("postgres: follower: emit a message: %w", err)
	}
	probe.Store(w)
	return nil
}
