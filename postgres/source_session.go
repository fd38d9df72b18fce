package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// session is one session of a Source: check the setup, start the stream
// from the slot's position (or from a new slot), and pass on what it
// carries, with a heartbeat of its own that finds a dead stream and a
// publication that changed under it. streamed is how long it streamed.
func (s *source) session(ctx context.Context, h follow.Handler) (streamed time.Duration, err error) {
	sender, err := s.dial.connect(ctx, "read")
	if err != nil {
		return 0, err
	}
	defer sender.Close(context.WithoutCancel(ctx))
	rels, versions, rules, err := s.checkSetup(ctx, sender)
	if err != nil {
		return 0, err
	}
	db, err := IdentifyDatabase(ctx, sender)
	if err != nil {
		return 0, failed(reasonFor(err, ReasonConnectionLost), err)
	}
	checker, err := s.dial.connect(ctx, "check")
	if err != nil {
		return 0, err
	}
	defer checker.Close(context.WithoutCancel(ctx))
	vctx, stopChecks := context.WithCancel(ctx)
	vis, checked := newVisibility(vctx, s, checker)
	defer func() { stopChecks(); <-checked }()
	rc, err := s.dial.connectStream(ctx)
	if err != nil {
		return 0, err
	}
	defer rc.Close(context.WithoutCancel(ctx))
	start, err := s.startPoint(ctx, sender, rc, rels, versions)
	if err != nil {
		return 0, err
	}
	start.Origin = db.Origin()
	var pubs []string
	for _, r := range rels {
		pubs = append(pubs, pgx.Identifier{publicationName(r.schema, r.name)}.Sanitize())
	}
	err = pglogrepl.StartReplication(ctx, rc, s.slot, pglogrepl.LSN(start.Pos), pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'", "publication_names " + quoteLiteral(strings.Join(pubs, ",")), "messages 'true'"}})
	if err != nil {
		return 0, failed(ReasonListen, fmt.Errorf("postgres: relay: start streaming slot %s from %s: %w", s.slot, pglogrepl.LSN(start.Pos), err))
	}
	if err := verifyStart(ctx, sender, s.slot, rc.PID(), pglogrepl.LSN(start.Pos)); err != nil {
		return 0, err
	}
	if err := h.Start(ctx, start); err != nil {
		return 0, err
	}
	s.sessions.Add(1)
	s.state.Store(int32(Following))
	began := time.Now()
	err = s.stream(ctx, sender, rc, h, rels, versions, rules, pglogrepl.LSN(start.Pos), vis)
	s.remake = remakeSlot(err)
	return time.Since(began), err
}

// remakeSlot reports whether a session's stream failed because its
// walsender found no publication of a name that checkSetup found just
// before: the publication was dropped and made again after the slot's
// position, and the walsender, which reads the catalog as of the changes
// it decodes, never finds it there. The slot cannot go past that point;
// the next session makes it anew (a reset: the followers read the tables
// again).
func remakeSlot(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42704" && strings.Contains(pgErr.Message, "publication")
}

// checkSetup checks what logical decoding needs and each table's
// publication, and returns the tables as the server resolves them, the
// versions of their publications, and their keys' forms.
func (s *source) checkSetup(ctx context.Context, c *pgx.Conn) ([]relation, []string, []*keyRule, error) {
	setup := func(err error) error {
		if errors.Is(err, ErrLogicalUnavailable) || errors.Is(err, ErrNotPublished) || errors.Is(err, ErrKeyNotIdentity) || errors.Is(err, ErrKeyType) {
			return failed(ReasonSetup, err)
		}
		return failed(ReasonConnectionLost, err)
	}
	if err := checkServer(ctx, c); err != nil {
		return nil, nil, nil, setup(err)
	}
	if err := checkReplication(ctx, c); err != nil {
		return nil, nil, nil, setup(err)
	}
	rels := make([]relation, len(s.tables))
	versions := make([]string, len(s.tables))
	rules := make([]*keyRule, len(s.tables))
	for i, t := range s.tables {
		r, err := resolve(ctx, c, t.Table)
		if err != nil {
			return nil, nil, nil, failed(ReasonSetup, err)
		}
		if err := checkPublished(ctx, c, r, t.Key); err != nil {
			return nil, nil, nil, setup(err)
		}
		if versions[i], err = readPublicationVersion(ctx, c, r); err != nil {
			return nil, nil, nil, setup(err)
		}
		// Any citext table's map serves the others: one database.
		prev := s.rules[i]
		for _, p := range rules[:i] {
			if p.lower != nil {
				prev = p
			}
		}
		if rules[i], err = readKeyRule(ctx, c, r, t.Key, s.dial.conf.RuntimeParams, prev); err != nil {
			return nil, nil, nil, setup(err)
		}
		rels[i] = r
	}
	s.rules = rules
	return rels, versions, rules, nil
}

// startPoint returns where the stream starts: the slot's confirmed
// position, or, for a slot that does not exist or lost its WAL, the
// consistent point of a new one (a reset).
func (s *source) startPoint(ctx context.Context, sender *pgx.Conn, rc *pgconn.PgConn, rels []relation, versions []string) (follow.Start, error) {
	start := follow.Start{Versions: versions}
	for i, r := range rels {
		start.Tables = append(start.Tables, r.String())
		start.Identities = append(start.Identities, follow.TableIdentity{ID: uint64(r.oid), Version: versions[i]})
	}
	// The WAL's end now, before the stream starts: whatever a relay
	// published from this database's history is behind it.
	var end string
	if err := sender.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		return start, failed(reasonFor(err, ReasonConnectionLost), fmt.Errorf("postgres: relay: read the WAL's end: %w", err))
	}
	walEnd, err := pglogrepl.ParseLSN(end)
	if err != nil {
		return start, failed(ReasonSlot, err)
	}
	start.End = uint64(walEnd)
	st, err := readSlot(ctx, sender, s.slot)
	if err != nil {
		return start, failed(ReasonSlot, err)
	}
	if st.active && (s.takeover || s.lastStream != 0 && st.activePID == int64(s.lastStream)) {
		if err := releaseSlot(ctx, sender, s.slot, st.activePID, s.deadline); err != nil {
			return start, failed(ReasonSlot, err)
		}
		if st, err = readSlot(ctx, sender, s.slot); err != nil {
			return start, failed(ReasonSlot, err)
		}
	}
	s.lastStream = rc.PID()
	if st.active {
		return start, failed(ReasonSlot, fmt.Errorf("postgres: relay: slot %s is in use by another connection (pid %d): does another relay have the name?", s.slot, st.activePID))
	}
	if s.remake && st.exists {
		s.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: relay's slot cannot decode past a publication that was dropped and made again; it makes the slot anew, and its followers read the tables again",
			slog.String("slot", s.slot))
	}
	if st.exists && st.walStatus != "lost" && !s.remake {
		start.Pos = uint64(st.confirmed)
		s.startAt(st.confirmed)
		return start, nil
	}
	var other string
	err = sender.QueryRow(ctx, `SELECT database FROM pg_replication_slots WHERE slot_name = $1 AND database <> current_database()`, s.slot).Scan(&other)
	switch {
	case err == nil:
		return start, failed(ReasonSetup, fmt.Errorf("%w: slot %s is of database %q", ErrSlotOfAnotherDatabase, s.slot, other))
	case !errors.Is(err, pgx.ErrNoRows):
		return start, failed(ReasonSlot, fmt.Errorf("postgres: relay: read slot %s: %w", s.slot, err))
	}
	if err := dropSlot(ctx, sender, s.slot); err != nil {
		return start, failed(ReasonSlot, err)
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, rc, s.slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
		SnapshotAction: "NOEXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication})
	if err != nil {
		return start, failed(ReasonSlot, fmt.Errorf("postgres: relay: create slot %s: %w", s.slot, err))
	}
	point, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return start, failed(ReasonSlot, err)
	}
	start.Pos, start.Reset = uint64(point), true
	s.startAt(point)
	return start, nil
}

// startAt sets what the handler confirmed to lsn, where a session's stream
// starts: what an earlier session's handler confirmed may be past it, and
// past the server's WAL, if the database was restored to an earlier point
// since. Confirmed to the server, such a position would move the slot past
// commits that no handler saw (the server takes a confirmed position as
// it comes), and the next session would start after them.
func (s *source) startAt(lsn pglogrepl.LSN) { s.acked.Store(uint64(lsn)) }

// stream passes on the session's stream until it fails or ctx ends.
func (s *source) stream(ctx context.Context, sender *pgx.Conn, rc *pgconn.PgConn, h follow.Handler, rels []relation, versions []string, rules []*keyRule, from pglogrepl.LSN, vis *visibility) error {
	tables := make([]decodedTable, len(rels))
	for i, r := range rels {
		tables[i] = decodedTable{schema: r.schema, rel: r.name, key: s.tables[i].Key, rule: rules[i]}
	}
	dec := newDecoder(tables...)
	beats := &sourceBeats{versions: identities(rels, versions)}
	sink := &sourceSink{s: s, ctx: ctx, h: h, token: newSourceToken(), beats: beats, need: from, free: from, partial: make([]bool, len(rels)), vis: vis}
	loopCtx, end := context.WithCancelCause(ctx)
	defer end(nil)
	send := make(chan int64, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer end(nil)
	wg.Go(func() { // the heartbeats: a send on a silent connection blocks
		for {
			select {
			case <-loopCtx.Done():
				return
			case seq := <-send:
				if err := s.beat(loopCtx, sender, rels, sink.token, seq, rc.PID(), &beats.probe); err != nil {
					end(failed(reasonFor(err, ReasonHeartbeatLost), err))
					return
				}
			}
		}
	})
	conn := rc.Conn()
	stopWatch := context.AfterFunc(loopCtx, func() { conn.SetReadDeadline(time.Now()) })
	defer stopWatch()
	last, next, nextStatus := time.Now(), time.Now(), time.Now()
	var received pglogrepl.LSN
	for {
		wake := next
		if t := last.Add(s.deadline + time.Millisecond); t.After(time.Now()) && t.Before(wake) {
			wake = t
		}
		if t := vis.wake(time.Now()); t.Before(wake) {
			wake = t
		}
		conn.SetReadDeadline(wake)
		msg, err := rc.ReceiveMessage(context.Background())
		now := time.Now()
		switch {
		case loopCtx.Err() != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return context.Cause(loopCtx)
		case err != nil && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded):
			return failed(reasonFor(err, ReasonConnectionLost), fmt.Errorf("postgres: relay receive: %w", err))
		case err == nil:
			if err := s.handle(msg, dec, sink, &received); err != nil {
				return err
			}
			// Time the handler took (publishing a big transaction) is
			// not the connection's silence.
			last = time.Now()
		}
		if err := vis.release(ctx, sink.deliver); err != nil {
			return err
		}
		if !now.Before(nextStatus) {
			if err := s.confirm(ctx, rc, received, sink.confirmable()); err != nil {
				return failed(reasonFor(err, ReasonConnectionLost), err)
			}
			nextStatus = now.Add(min(statusEvery, s.heartbeat))
		}
		beats.mu.Lock()
		oldest := len(beats.out) > 0
		beats.mu.Unlock()
		if oldest && now.Sub(last) > s.deadline && !s.working(&beats.probe, now) {
			return failed(ReasonHeartbeatLost, fmt.Errorf("postgres: relay: nothing arrived for %v with a heartbeat out, and the walsender is not at work: the connection is dead",
				now.Sub(last).Round(time.Millisecond)))
		}
		if s.recheck.Load() {
			next = now // a relayed follower saw another identity of a table (Recheck)
		}
		if !now.Before(next) {
			beats.mu.Lock()
			select {
			case send <- beats.seq + 1:
				beats.seq++
				beats.out = append(beats.out, now)
				s.recheck.Store(false)
			default: // the last one is still being sent
			}
			beats.mu.Unlock()
			next = now.Add(s.heartbeat)
		}
	}
}

// working reports whether the session's walsender was found at work
// within a heartbeat and the deadline before now (see Follower.busy).
func (s *source) working(probe *atomic.Pointer[walsender], now time.Time) bool {
	w := probe.Load()
	return w != nil && !w.worked.IsZero() && now.Sub(w.worked) <= s.heartbeat+s.deadline
}

// handle handles one message of the replication connection.
func (s *source) handle(msg pgproto3.BackendMessage, dec *decoder, sink *sourceSink, received *pglogrepl.LSN) error {
	cd, ok := msg.(*pgproto3.CopyData)
	if !ok {
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			pgErr := pgconn.ErrorResponseToPgError(e)
			return failed(reasonFor(pgErr, ReasonConnectionLost), fmt.Errorf("postgres: relay stream: %w", pgErr))
		}
		return nil
	}
	if len(cd.Data) == 0 {
		return nil
	}
	switch cd.Data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
		if err != nil {
			return failed(ReasonNotification, err)
		}
		*received = max(*received, k.ServerWALEnd)
		if held := sink.vis.holding(); !dec.open && !held {
			sink.free = max(sink.free, k.ServerWALEnd)
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return failed(ReasonNotification, err)
		}
		*received = max(*received, x.WALStart+pglogrepl.LSN(len(x.WALData)))
		if err := dec.decode(x.WALData, sink); err != nil {
			var se *sessionError
			if errors.As(err, &se) {
				return err
			}
			return failed(ReasonNotification, err)
		}
	}
	return nil
}

// confirm sends the session's position to the server.
func (s *source) confirm(ctx context.Context, rc *pgconn.PgConn, received, flush pglogrepl.LSN) error {
	sctx, cancel := context.WithTimeout(ctx, s.deadline)
	defer cancel()
	return pglogrepl.SendStandbyStatusUpdate(sctx, rc, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(received, flush), WALFlushPosition: max(flush, 1), WALApplyPosition: max(flush, 1)})
}

// beat sends heartbeat seq of the session whose heartbeats' route is
// token, with the tables' identities as its transaction sees them (the
// oid each name resolves to and the version of the session's table's
// publication, as identities writes them), and reads what the walsender
// of pid does.
func (s *source) beat(ctx context.Context, c *pgx.Conn, rels []relation, token string, seq int64, pid uint32, probe *atomic.Pointer[walsender]) error {
	bctx, cancel := context.WithTimeout(ctx, s.deadline)
	defer cancel()
	args := []any{controlPrefixOf(token), strconv.FormatInt(seq, 10), int64(pid)}
	parts := make([]string, len(rels))
	for i, r := range rels {
		args = append(args, publicationName(r.schema, r.name), r.oid, sanitizeTable(s.tables[i].Table)) // the name as given: resolved as the application does
		v := strings.NewReplacer("$1", fmt.Sprintf("$%d", len(args)-2), "$2", fmt.Sprintf("$%d", len(args)-1)).Replace(publicationVersion)
		parts[i] = fmt.Sprintf("coalesce(to_regclass($%d)::oid::text, '-') || ' ' || coalesce(%s, '-')", len(args), v)
	}
	q := `SELECT pg_logical_emit_message(true, $1, $2 || ' ' || ` + strings.Join(parts, ` || '|' || `) + `)` +
		strings.ReplaceAll(walsenderQuery, "$5", "$3")
	sent := time.Now()
	w, err := scanWalsender(c.QueryRow(bctx, q, args...), sent, probe.Load())
	if err != nil {
		return fmt.Errorf("postgres: relay: heartbeat: %w", err)
	}
	probe.Store(w)
	var retained int64
	if err := c.QueryRow(bctx, `SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, s.slot).Scan(&retained); err != nil {
		return fmt.Errorf("postgres: relay: read slot %s: %w", s.slot, err)
	}
	s.retained.Store(retained)
	if time.Since(s.noted) >= noteEvery {
		s.noted = time.Now()
		s.noteSlot(bctx, c, rels)
	}
	return nil
}

// noteSlot notes in cuckooguard_slots, beside each table (or in the
// registry of WithRegistry), that the Source uses its slot now, for its
// tables of that schema ("schema.table", comma-separated), best effort:
// a role that cannot write the table relays all the same, and
// DropStaleSlots then never finds the slot stale.
func (s *source) noteSlot(ctx context.Context, c *pgx.Conn, rels []relation) {
	bySchema := map[string][]string{}
	for _, r := range rels {
		bySchema[r.schema] = append(bySchema[r.schema], r.String())
	}
	for schema, tables := range bySchema {
		if err := noteSlot(ctx, c, s.registry.registryIn(schema), s.slot, strings.Join(tables, ","), s.name); err != nil && !s.noteSaid {
			s.noteSaid = true
			s.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: relay cannot note its slot's use in cuckooguard_slots; DropStaleSlots will not find it stale",
				slog.String("slot", s.slot), slog.Any("error", err))
		}
	}
}
