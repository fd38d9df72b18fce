package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// errTruncated ends a session after a TRUNCATE of the table: the guard
// holds keys that are gone, and only a full read removes them.
var errTruncated = errors.New("postgres: the table was truncated")

// errBigTransaction ends a session after a transaction that deleted more
// keys than it holds back: the guard holds keys that are gone.
var errBigTransaction = errors.New("postgres: a transaction deleted more keys than the follower holds back")

// maxTxDeletes is the most deleted keys a session holds back until their
// transaction commits (8 bytes and more each); a transaction that deletes
// more ends the session at its commit, and the next one reads the table.
const maxTxDeletes = 1 << 20

// Prefixes of the logical decoding messages a Follower sends itself.
const (
	originPrefix  = "cuckooguard.origin" // Tag: this transaction is the tagging process's own
	controlPrefix = "cuckooguard.hb"     // markers and heartbeats
)

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

// followLogical is one session of a logical-decoding follower: check the
// setup, start from the position the guard reflects (resume), from a
// saved guard (restore) or from a full read under the snapshot the slot
// exports, then apply the stream, with a heartbeat. It sets *following
// when the marker comes back.
func (f *Follower[K]) followLogical(ctx context.Context, following *time.Time) error {
	sender, err := f.connect(ctx, "read") // checks, the read, heartbeats, the slot's record
	if err != nil {
		return err
	}
	defer sender.Close(context.WithoutCancel(ctx))
	for _, check := range []func() error{
		func() error { return checkServer(ctx, sender) },
		func() error { return checkReplication(ctx, sender) },
		func() error { return checkPublished(ctx, sender, f.table, f.key) },
	} {
		if err := check(); err != nil {
			if errors.Is(err, ErrLogicalUnavailable) || errors.Is(err, ErrNotPublished) {
				return failed(ReasonSetup, err)
			}
			return failed(ReasonConnectionLost, err)
		}
	}
	schema, rel, err := splitTable(ctx, sender, f.table)
	if err != nil {
		return failed(ReasonSetup, err)
	}
	if f.origin != "" {
		// The table as the server resolves it names the slot; the first
		// session's name stays (a restored guard is of that slot).
		f.slot = cmp.Or(f.slot, slotName(schema, rel, f.origin))
	}
	rc, err := f.connectStream(ctx)
	if err != nil {
		return err
	}
	defer rc.Close(context.WithoutCancel(ctx))
	f.pid.Store(rc.PID())
	f.state.Store(int32(Resyncing))
	slot, start, err := f.startPoint(ctx, sender, rc)
	if err != nil {
		return err
	}
	if f.slot != "" {
		if err := noteSlot(ctx, sender, schema, f.slot, f.table, f.origin); err != nil {
			return failed(ReasonSlot, err)
		}
	}
	err = pglogrepl.StartReplication(ctx, rc, slot, start, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'",
		"publication_names '" + publicationName(schema, rel) + "'",
		"messages 'true'", // the tags, markers and heartbeats
	}})
	if err != nil {
		// Resuming from a position whose WAL is gone, say.
		f.pos.valid = false
		f.needRead = ReadResumeFailed
		return failed(ReasonListen, fmt.Errorf("postgres: follower: start streaming slot %s from %s: %w", slot, start, err))
	}
	f.setApplied(start)
	lastNote := time.Now()
	s, err := f.startSession(ctx, newToken(), following, func(ctx context.Context, payload string) error {
		if f.slot != "" && time.Since(lastNote) > noteEvery {
			// Best effort: a slot not noted for long may be dropped by
			// DropStaleSlots only while it is not active.
			lastNote = time.Now()
			noteSlot(ctx, sender, schema, f.slot, f.table, f.origin)
			if st, err := readSlot(ctx, sender, f.slot); err == nil {
				f.retained.Store(st.retained)
			}
		}
		return f.emit(ctx, sender, controlPrefix, payload)
	})
	if err != nil {
		return err
	}
	defer s.stop() // before sender closes (deferred earlier)
	st := stream[K]{f: f, s: s, schema: schema, rel: rel, rc: rc}
	nextStatus := time.Now()
	noMarker := func(waited time.Duration) error {
		return failed(ReasonHeartbeatLost, fmt.Errorf("postgres: follower: the marker sent %v ago has not come back in the stream", waited.Round(time.Millisecond)))
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
		conn.SetReadDeadline(f.wake(&s.hb, s.next))
		waited := time.Now()
		msg, err := rc.ReceiveMessage(context.Background())
		now := time.Now()
		busy = err == nil && now.Sub(waited) < nap
		for {
			if err := s.waitEnded(ctx, "receive", err); err != nil {
				return err
			}
			if err != nil {
				break
			}
			s.hb.last = now
			reply, herr := st.handle(msg, now)
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
		if !st.inTx {
			if err := f.maybeSave(ctx); err != nil {
				f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower could not save its guard", slog.Any("error", err))
			}
		}
		if !now.Before(nextStatus) {
			if err := st.status(ctx); err != nil {
				return failed(ReasonConnectionLost, err)
			}
			nextStatus = now.Add(min(statusEvery, f.heartbeat))
		}
		if err := f.tick(s, now, noMarker); err != nil {
			return err
		}
	}
}

// startPoint decides where the session's stream starts, and makes the
// guard reflect exactly the changes before it: the position the guard
// reflects already (a lost connection, resumed), a saved guard (the first
// session, with a snapshot file), or a full read under the snapshot the
// slot exports as it is made. It returns the slot to stream from.
func (f *Follower[K]) startPoint(ctx context.Context, sender *pgx.Conn, rc *pgconn.PgConn) (string, pglogrepl.LSN, error) {
	if f.slot == "" {
		return f.readAll(ctx, sender, rc, cmpOr(f.needRead, ReadNoResume))
	}
	st, err := readSlot(ctx, sender, f.slot)
	if err != nil {
		return "", 0, failed(ReasonSlot, err)
	}
	if st.active {
		return "", 0, failed(ReasonSlot, fmt.Errorf("postgres: follower: slot %s is in use by another connection: does another process have the origin %q?", f.slot, f.origin))
	}
	reason := f.needRead
	switch {
	case reason == "" && f.pos.valid:
		switch {
		case !st.exists:
			reason = ReadSlotMissing
		case st.walStatus == "lost":
			reason = ReadSlotLost
		case st.confirmed > f.pos.applied:
			reason = ReadResumeFailed // someone moved the slot past us
		default:
			return f.slot, f.pos.applied, nil
		}
	case reason == ReadStart && f.snapPath != "":
		lsn, why := f.restore(ctx, st)
		if why == "" {
			return f.slot, lsn, nil
		}
		reason = why
	}
	return f.readAll(ctx, sender, rc, cmpOr(reason, ReadResumeFailed))
}

func cmpOr(r, def ReadReason) ReadReason {
	if r == "" {
		return def
	}
	return r
}

// restore installs the guard of the snapshot file if the slot still has
// the changes since its position, and returns that position. Otherwise it
// returns why a full read is needed, and logs it.
func (f *Follower[K]) restore(ctx context.Context, st slotState) (pglogrepl.LSN, ReadReason) {
	h, g, err := readSnapshotFile(f.snapPath, guard.Like(f.feed.Guard()))
	fallback := func(why ReadReason, detail string) (pglogrepl.LSN, ReadReason) {
		if g != nil {
			g.Close()
		}
		f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower cannot start from its snapshot file; it reads the table",
			slog.String("file", f.snapPath), slog.String("reason", string(why)), slog.String("detail", detail))
		return 0, why
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fallback(ReadNoSnapshot, err.Error())
	case err != nil:
		return fallback(ReadBadSnapshot, err.Error())
	case h.slot != f.slot || h.table != f.table || h.key != f.key:
		return fallback(ReadBadSnapshot, fmt.Sprintf("the file is of slot %s, table %s, key %s", h.slot, h.table, h.key))
	case !st.exists:
		return fallback(ReadSlotMissing, "slot "+f.slot+" does not exist")
	case st.walStatus == "lost":
		return fallback(ReadSlotLost, "the server removed WAL that slot "+f.slot+" needed")
	case st.confirmed > h.lsn:
		return fallback(ReadStaleSnapshot, fmt.Sprintf("the slot is at %s, the file at %s", st.confirmed, h.lsn))
	}
	if err := f.feed.Replace(g); err != nil {
		return fallback(ReadBadSnapshot, err.Error())
	}
	// The Inserts that ran before Replace added their keys to the guard
	// it closed, and tagged their writes with the run's tag until now:
	// those must be applied from the stream, not skipped. Replace waited
	// for them (and held the later ones back), so a new tag tells them
	// apart; an Insert that starts between Replace and here gets one
	// extra copy (applied, and added), never none.
	f.tag.Store(new(newRunTag(f.origin)))
	f.pos = position{valid: true, applied: h.lsn, persisted: h.lsn, saved: time.Now()}
	f.restores.Add(1)
	f.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: follower starts from its snapshot file",
		slog.String("file", f.snapPath), slog.String("lsn", h.lsn.String()), slog.Int("keys", g.Len()))
	return h.lsn, ""
}

// readAll reads the whole table into a fresh guard, under the snapshot
// that a new slot exports as it is made, and returns the slot and its
// consistent point, where the read and the stream meet: the read sees
// exactly the transactions that committed before it, and the stream
// carries exactly the others. A permanent slot is dropped and made again;
// without an origin the slot is temporary and dies with the session.
//
// The slot is made inside the Loader's Resync, after the fresh guard is
// installed for inserts: Resync waits for this process's inserts in
// flight, whose changes the stream skips as its own, so each of them has
// committed before the slot's snapshot (and the read sees it) or reaches
// the fresh guard directly.
func (f *Follower[K]) readAll(ctx context.Context, sender *pgx.Conn, rc *pgconn.PgConn, reason ReadReason) (string, pglogrepl.LSN, error) {
	f.pos.valid = false
	slot, temporary := f.slot, f.slot == ""
	if temporary {
		slot = fmt.Sprintf("cg_tmp_%016x", rand.Uint64())
	} else if err := dropSlot(ctx, sender, slot); err != nil {
		return "", 0, failed(ReasonSlot, err)
	}
	start := time.Now()
	var point pglogrepl.LSN
	var n int64
	err := f.feed.Resync(ctx, func(ctx context.Context, add func(K) error) error {
		res, err := pglogrepl.CreateReplicationSlot(ctx, rc, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
			Temporary: temporary, SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication})
		if err != nil {
			return failed(ReasonSlot, fmt.Errorf("create slot %s: %w", slot, err))
		}
		if point, err = pglogrepl.ParseLSN(res.ConsistentPoint); err != nil {
			return failed(ReasonSlot, fmt.Errorf("slot %s: %w", slot, err))
		}
		tx, err := sender.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		// The exported snapshot lives until the slot's connection runs its
		// next command, START_REPLICATION: import it first.
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(res.SnapshotName)); err != nil {
			return err
		}
		n, err = f.scan(ctx, tx, add)
		return err
	})
	if err != nil {
		var se *sessionError
		if errors.As(err, &se) {
			return "", 0, err
		}
		return "", 0, failed(ReasonResync, fmt.Errorf("postgres: follower read: %w", err))
	}
	f.pos = position{valid: true, applied: point, persisted: f.pos.persisted}
	f.needRead = ""
	f.read(ctx, reason, n, time.Since(start))
	return slot, point, nil
}

// setApplied records that the guard reflects the changes up to lsn.
func (f *Follower[K]) setApplied(lsn pglogrepl.LSN) {
	if lsn > f.pos.applied {
		f.pos.applied = lsn
	}
	f.appliedLSN.Store(uint64(f.pos.applied))
}

// flushPosition is the position a session confirms to the server, which
// may then discard the WAL before it: the snapshot file's, with one (a
// restarted process streams from there), else the applied one.
func (f *Follower[K]) flushPosition() pglogrepl.LSN {
	if f.snapPath != "" {
		return f.pos.persisted
	}
	return f.pos.applied
}

// maybeSave writes the snapshot file if one is configured, the guard
// reflects a position, and that position has moved since the last write
// and the interval has passed (or the guard was read anew). It runs
// between transactions: the guard then reflects exactly pos.applied, and
// no change is applied while it writes (this process's own Inserts may add
// keys meanwhile, which the file may or may not hold: the stream does not
// skip them in a later run).
func (f *Follower[K]) maybeSave(ctx context.Context) error {
	if f.snapPath == "" || !f.pos.valid || f.pos.applied <= f.pos.persisted ||
		(!f.pos.saved.IsZero() && time.Since(f.pos.saved) < f.snapEvery) {
		return nil
	}
	return f.save(ctx)
}

// save writes the snapshot file at pos.applied.
func (f *Follower[K]) save(ctx context.Context) error {
	start := time.Now()
	lsn := f.pos.applied
	n, err := writeSnapshotFile(f.snapPath, snapFile{lsn: lsn, slot: f.slot, table: f.table, key: f.key}, f.feed.Guard())
	f.pos.saved = time.Now() // also after a failure: not again at once
	if err != nil {
		return err
	}
	f.pos.persisted = lsn
	f.snapshots.Add(1)
	f.lastSnap.Store(time.Now().UnixNano())
	f.log.LogAttrs(ctx, slog.LevelDebug, "cuckooguard: follower saved its guard",
		slog.String("file", f.snapPath), slog.String("lsn", lsn.String()), slog.Int64("bytes", n), slog.Duration("took", time.Since(start)))
	return nil
}

// saveOnExit writes the snapshot file when Run returns, if the guard
// reflects a position the file does not have yet.
func (f *Follower[K]) saveOnExit() {
	if f.snapPath == "" || !f.pos.valid || f.pos.applied <= f.pos.persisted {
		return
	}
	if err := f.save(context.Background()); err != nil {
		f.log.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: follower could not save its guard", slog.Any("error", err))
	}
}

// emit sends a transactional logical decoding message with prefix and
// content through c, within the heartbeat deadline: it comes back in the
// stream in its own transaction, in commit order.
func (f *Follower[K]) emit(ctx context.Context, c *pgx.Conn, prefix, content string) error {
	ectx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	if _, err := c.Exec(ectx, `SELECT pg_logical_emit_message(true, $1, $2)`, prefix, content); err != nil {
		return fmt.Errorf("postgres: follower: emit a message: %w", err)
	}
	return nil
}

// connectStream opens the replication connection, within the heartbeat
// deadline.
func (f *Follower[K]) connectStream(ctx context.Context) (*pgconn.PgConn, error) {
	cctx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	conf := f.conf.Config.Copy()
	conf.RuntimeParams["replication"] = "database"
	f.name(conf.RuntimeParams, "stream")
	c, err := pgconn.ConnectConfig(cctx, conf)
	if err != nil {
		return nil, failed(ReasonConnect, fmt.Errorf("postgres: follower connect for streaming: %w", err))
	}
	return c, nil
}

// stream decodes one session's stream of pgoutput messages.
type stream[K comparable] struct {
	f        *Follower[K]
	s        *session
	schema   string // the table's
	rel      string
	rc       *pgconn.PgConn
	relID    uint32 // the table's relation id in the stream; 0 until its Relation message
	keyCol   int    // the key column's index in the table's tuples
	received pglogrepl.LSN
	inTx     bool // between a Begin and its Commit
	own      bool // the transaction carries this Follower's tag
	trunc    bool // the transaction truncated the table
	// The keys the transaction deleted, applied at its commit. A session
	// that ends within a transaction has applied its creations (a later
	// session replays them: an extra copy each) but none of its removals,
	// which a replay would apply twice, taking copies of other keys.
	deletes  []K
	overflow bool // more than maxTxDeletes: none are kept
}

// handle handles one message of the replication connection, at now. It
// reports whether the server asked for the session's position.
func (st *stream[K]) handle(msg pgproto3.BackendMessage, now time.Time) (reply bool, err error) {
	cd, ok := msg.(*pgproto3.CopyData)
	if !ok {
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			return false, failed(ReasonConnectionLost, fmt.Errorf("postgres: follower stream: %w", pgconn.ErrorResponseToPgError(e)))
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
		st.received = max(st.received, k.ServerWALEnd)
		if !st.inTx {
			// Everything the server decoded before this was sent before
			// it: nothing of the table lies between the last transaction
			// applied and here. Moving past it lets the slot release WAL
			// while the table is quiet and others are busy.
			st.f.setApplied(k.ServerWALEnd)
		}
		return k.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return false, failed(ReasonNotification, err)
		}
		st.received = max(st.received, x.WALStart+pglogrepl.LSN(len(x.WALData)))
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return false, failed(ReasonNotification, err)
		}
		return false, st.message(m, now)
	}
	return false, nil
}

// message applies one pgoutput message.
func (st *stream[K]) message(m pglogrepl.Message, now time.Time) error {
	f := st.f
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		if m.Namespace != st.schema || m.RelationName != st.rel {
			return nil // another table of the publication
		}
		st.relID, st.keyCol = m.RelationID, -1
		for i, c := range m.Columns {
			if c.Name == f.key {
				st.keyCol = i
			}
		}
		if st.keyCol < 0 {
			return failed(ReasonNotification, fmt.Errorf("%w: the stream of table %s has no column %s", ErrNotPublished, f.table, f.key))
		}
	case *pglogrepl.BeginMessage:
		st.inTx, st.own, st.trunc, st.overflow = true, false, false, false
		st.deletes = st.deletes[:0]
	case *pglogrepl.LogicalDecodingMessage:
		switch m.Prefix {
		case originPrefix:
			// Not a run's earlier tag: see restore.
			tag := *f.tag.Load()
			st.own = st.own || (tag != "" && string(m.Content) == tag)
		case controlPrefix:
			f.control(st.s, string(m.Content), now)
		}
	case *pglogrepl.InsertMessage:
		if m.RelationID != st.relID {
			return nil
		}
		if st.own {
			f.skipped.Add(1) // the Loader added it before writing
			return nil
		}
		return st.apply(m.Tuple, false, now)
	case *pglogrepl.UpdateMessage:
		// Without an old tuple the key did not change (a publication of
		// the key column alone sends it only then).
		if m.RelationID != st.relID || m.OldTuple == nil {
			return nil
		}
		if err := st.apply(m.OldTuple, true, now); err != nil {
			return err
		}
		return st.apply(m.NewTuple, false, now)
	case *pglogrepl.DeleteMessage:
		if m.RelationID != st.relID {
			return nil
		}
		return st.apply(m.OldTuple, true, now)
	case *pglogrepl.TruncateMessage:
		for _, id := range m.RelationIDs {
			st.trunc = st.trunc || id == st.relID
		}
	case *pglogrepl.CommitMessage:
		for _, k := range st.deletes {
			if err := f.feed.Apply(guarded.Change[K]{Key: k, Deleted: true}); err != nil {
				return failed(ReasonNotification, err)
			}
		}
		st.deletes = st.deletes[:0]
		if cap(st.deletes) > 4096 {
			st.deletes = nil // a big transaction's buffer goes with it
		}
		st.inTx = false
		f.setApplied(m.TransactionEndLSN)
		switch {
		case st.trunc:
			return errTruncated
		case st.overflow:
			return errBigTransaction
		}
	}
	return nil
}

// apply applies the key of tuple: its creation or, if deleted, its
// deletion.
func (st *stream[K]) apply(tuple *pglogrepl.TupleData, deleted bool, now time.Time) error {
	if tuple == nil || st.keyCol < 0 || st.keyCol >= len(tuple.Columns) || tuple.Columns[st.keyCol].DataType != pglogrepl.TupleDataTypeText {
		return failed(ReasonNotification, fmt.Errorf("postgres: follower: a change of table %s without its key", st.f.table))
	}
	k, err := st.f.parse(string(tuple.Columns[st.keyCol].Data))
	if err != nil {
		return failed(ReasonNotification, fmt.Errorf("postgres: follower: parse key %q: %w", tuple.Columns[st.keyCol].Data, err))
	}
	if deleted {
		switch {
		case st.overflow:
		case len(st.deletes) == maxTxDeletes:
			st.deletes, st.overflow = nil, true
		default:
			st.deletes = append(st.deletes, k) // applied at the commit
		}
		st.f.applied.Add(1)
		return nil
	}
	if err := st.f.feed.Apply(guarded.Change[K]{Key: k, Deleted: deleted}); err != nil {
		return failed(ReasonNotification, err)
	}
	st.f.applied.Add(1)
	st.f.lastApplied.Store(now.UnixNano())
	return nil
}

// status confirms the session's position to the server: what it received,
// what it may discard (flushPosition), and what the guard reflects.
func (st *stream[K]) status(ctx context.Context) error {
	f := st.f
	flush := f.flushPosition()
	if flush == 0 {
		// pglogrepl takes 0 for "as written": never confirm more than is
		// kept. The slot's own position is no further than where the
		// stream started.
		flush = 1
	}
	sctx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	err := pglogrepl.SendStandbyStatusUpdate(sctx, st.rc, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(st.received, f.pos.applied),
		WALFlushPosition: flush,
		WALApplyPosition: f.pos.applied,
	})
	if err != nil {
		return fmt.Errorf("postgres: follower: confirm position: %w", err)
	}
	f.flushedLSN.Store(uint64(flush))
	return nil
}
