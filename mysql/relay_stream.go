package mysql

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/cuckooguard/cuckooguard/follow"
)

// setupWait bounds a session's setup statements: a collation's weights
// take a recursive query of 65,536 rows.
const setupWait = 30 * time.Second

// session is one session of the Source: check the setup, start the
// stream from the saved place (or the binlog's end), and pass on what it
// carries. streamed is how long it streamed.
func (s *relaySource) session(ctx context.Context, h follow.Handler) (streamed time.Duration, err error) {
	read, closeRead, err := dial(ctx, s.d.srv, s.deadline)
	if err != nil {
		return 0, err
	}
	defer closeRead()
	_ = read.SetDeadline(time.Now().Add(max(setupWait, s.deadline)))
	if err := checkServer(read); err != nil {
		return 0, err
	}
	if err := checkRowMetadata(read); err != nil {
		return 0, err
	}
	db := s.d.srv.db
	for _, t := range []struct{ name, columns string }{{controlTable, controlColumns}, {relayTable, relayColumns}} {
		if err := ensureTable(read, db, t.name, t.columns); err != nil {
			return 0, err
		}
	}
	if err := ensureTable(read, db, s.d.tagTable, tagColumns); err != nil {
		s.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: relay cannot create the tag table; Follower.Tag fails until it exists", slog.Any("error", err))
	}
	st := &relayStream{s: s, h: h, db: db, byName: map[string]int{}, route: sourceRoute(s.name), token: newToken(), places: newPlaceLog()}
	withID := canReadIDs(read)
	start := follow.Start{}
	for i, t := range s.tables {
		col, form, err := s.d.column(read, t.Table, t.Key)
		if err != nil {
			return 0, err
		}
		id, err := readIdentity(read, col.schema, col.table, t.Key, withID)
		if err != nil {
			return 0, err
		}
		st.byName[col.table] = i
		st.keys = append(st.keys, t.Key)
		st.forms = append(st.forms, form)
		start.Tables = append(start.Tables, col.schema+"."+col.table)
		start.Versions = append(start.Versions, id.Version)
		start.Identities = append(start.Identities, id)
	}
	st.identities = identitiesText(start.Identities)
	id, domain, err := readServer(read)
	if err != nil {
		return 0, err
	}
	start.Origin, st.tokDomain = originOf(id, domain, db), domain
	at, gtidText, err := s.startPoint(ctx, read, &start, &st.serverID)
	if err != nil {
		return 0, err
	}
	if st.gtid, err = parseGTIDPos(gtidText); err != nil {
		return 0, err
	}
	st.file, st.at = at.Name, at
	st.fromSaved = !start.Reset
	defer func() {
		// A saved place whose stream fails before its first transaction
		// (error 1236, rows before any GTID event) is not one of this
		// binlog's, and one whose stream later sends an event that cannot
		// be decoded would fail there again: the next session starts at
		// the binlog's end (the followers read their tables again).
		if st.fromSaved && (errors.Is(err, errUndecodable) || !st.sawGTID && (readFailed(err) || errors.Is(err, errHistory))) {
			s.unreadable = placeText(at)
		}
	}()
	hb, closeHB, err := dial(ctx, s.d.srv, s.deadline)
	if err != nil {
		return 0, err
	}
	defer closeHB()
	var parts []string
	for i, t := range s.tables {
		parts = append(parts, identitySQL(db, strings.SplitN(start.Tables[i], ".", 2)[1], t.Key, withID))
	}
	beat, err := hb.Prepare(emitSQL("CONCAT_WS('|', " + strings.Join(parts, ", ") + ")"))
	if err != nil {
		return 0, fmt.Errorf("mysql: relay: prepare the heartbeat: %w", privilege(err))
	}
	defer beat.Close()
	// A probe carries no identities: reading them (information_schema)
	// costs the server several times the write itself, and a probe is
	// written as often as the probe before it returns while commits come.
	probe, err := hb.Prepare(emitSQL("''"))
	if err != nil {
		return 0, fmt.Errorf("mysql: relay: prepare the probe: %w", privilege(err))
	}
	defer probe.Close()
	var streamConn net.Conn
	dial := dialer(s.deadline)
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID: s.serverID, Flavor: gomysql.MariaDBFlavor,
		Host: s.d.srv.host, Port: s.d.srv.port, User: s.d.srv.user, Password: s.d.srv.password,
		DisableRetrySync: true, Logger: quiet,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := dial(ctx, network, addr)
			streamConn = nc // StartSync dials on this goroutine
			return nc, err
		},
	})
	defer syncer.Close()
	stream, err := syncer.StartSync(at)
	if err != nil {
		return 0, streamError(err, at, s.serverID)
	}
	if streamConn != nil {
		_ = streamConn.SetDeadline(time.Time{})
	}
	_ = read.SetDeadline(time.Time{})
	s.acked.Store(start.Pos) // what an earlier session's handler confirmed may be past it (a reset)
	st.need.Store(start.Pos)
	st.free.Store(start.Pos)
	st.places.add(start.Pos, gtidText)
	if err := h.Start(ctx, start); err != nil {
		return 0, err
	}
	s.sessions.Add(1)
	s.state.Store(true)
	began := time.Now()
	err = st.run(ctx, read, stream, hb, beat, probe, at.Name)
	return time.Since(began), err
}

// checkRowMetadata returns an error wrapping ErrSetup unless the binlog's
// table maps carry the columns' names.
func checkRowMetadata(c *client.Conn) error {
	r, err := c.Execute("SELECT @@GLOBAL.binlog_row_metadata")
	if err != nil {
		return fmt.Errorf("%w: read binlog_row_metadata: %v (MariaDB 10.5 or later has it)", ErrSetup, err)
	}
	if v, _ := r.GetString(0, 0); !strings.EqualFold(v, "FULL") {
		return fmt.Errorf("%w: binlog_row_metadata is %s; a relay finds each row's key by its column's name: SET GLOBAL binlog_row_metadata = 'FULL' and set binlog_row_metadata=FULL in the server's configuration", ErrSetup, v)
	}
	return nil
}

// identitiesText is the form of the tables' identities that the
// Source's heartbeat row carries (CONCAT_WS('|', ...)).
func identitiesText(ids []follow.TableIdentity) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = id.String()
	}
	return strings.Join(parts, "|")
}

// startPoint sets start's Pos, End and Reset and returns where the stream
// starts and the GTID position there: the relay's saved place, if the
// server can be proven to hold it, or else the binlog's end (a reset).
func (s *relaySource) startPoint(ctx context.Context, c *client.Conn, start *follow.Start, serverID *uint32) (gomysql.Position, string, error) {
	r, err := c.Execute("SHOW MASTER STATUS")
	if err != nil {
		return gomysql.Position{}, "", fmt.Errorf("%w: SHOW MASTER STATUS: %v (GRANT BINLOG MONITOR, or REPLICATION CLIENT, TO the relay's user)", ErrSetup, err)
	}
	var end gomysql.Position
	if r.RowNumber() > 0 {
		end.Name, _ = r.GetString(0, 0)
		p, _ := r.GetUint(0, 1)
		end.Pos = uint32(p)
	}
	if end.Name == "" || !validFile.MatchString(end.Name) {
		return end, "", fmt.Errorf("%w: the server has no binary log (start it with --log-bin)", ErrSetup)
	}
	if start.End, err = encodePos(end.Name, end.Pos); err != nil {
		return end, "", err
	}
	src, err := readSource(c)
	if err != nil {
		return end, "", err
	}
	*serverID = src.serverID
	why := "the relay has no saved place"
	r, err = c.Execute("SELECT server_id, file, pos, gtid_pos FROM `"+relayTable+"` WHERE name = ?", s.name)
	if err != nil {
		return end, "", fmt.Errorf("mysql: relay: read its place: %w", privilege(err))
	}
	if r.RowNumber() == 1 {
		id, _ := r.GetUint(0, 0)
		file, _ := r.GetString(0, 1)
		pos, _ := r.GetUint(0, 2)
		gtidText, _ := r.GetString(0, 3)
		saved, perr := parseGTIDPos(gtidText)
		p := resumePoint{serverID: uint32(id), file: file, end: uint32(pos), pos: saved}
		switch {
		case file == "" || pos == 0:
		case perr != nil || !validFile.MatchString(file):
			why = fmt.Sprintf("its saved place %s:%d gtid %q is unreadable", file, pos, gtidText)
		case placeText(gomysql.Position{Name: file, Pos: uint32(pos)}) == s.unreadable:
			why = fmt.Sprintf("the binlog cannot be read from its saved place %s:%d (error 1236: purged, or not at an event of this history; or an event after it cannot be decoded)", file, pos)
		default:
			if why = p.refuse(src, column{}); why == "" {
				why = sameHistory(c, file, uint32(pos), saved)
			}
		}
		if file != "" && pos != 0 && why == "" {
			if start.Pos, err = encodePos(file, uint32(pos)); err != nil {
				return end, "", err
			}
			return gomysql.Position{Name: file, Pos: uint32(pos)}, gtidText, nil
		}
	}
	gr, err := c.Execute(fmt.Sprintf("SELECT BINLOG_GTID_POS('%s', %d)", end.Name, end.Pos))
	if err != nil {
		return end, "", fmt.Errorf("mysql: relay: read the GTID position at %s:%d: %w", end.Name, end.Pos, err)
	}
	gtidText, _ := gr.GetString(0, 0)
	start.Pos, start.Reset = start.End, true
	s.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: relay starts at the binlog's end; its followers read the tables again",
		slog.String("reason", why), slog.String("position", fmt.Sprintf("%s:%d", end.Name, end.Pos)))
	return end, gtidText, nil
}

// sameHistory returns why the binlog at file:pos is not the place saved
// with the GTID position saved, "" if it is: the server's own GTID
// position at that place (BINLOG_GTID_POS) must be the saved one exactly.
// A binlog reset (RESET MASTER) or a copy of another server's data with
// the same server id can hold the file, at that length, with a GTID
// position not behind the saved one; the GTID position at the very place
// tells the histories apart unless the other one has the same
// transactions' GTIDs ending at the same offset.
func sameHistory(c *client.Conn, file string, pos uint32, saved gtidPos) string {
	r, err := c.Execute(fmt.Sprintf("SELECT BINLOG_GTID_POS('%s', %d)", file, pos))
	if err != nil {
		return fmt.Sprintf("the GTID position at its saved place %s:%d cannot be read: %v", file, pos, err)
	}
	text, _ := r.GetString(0, 0)
	at, err := parseGTIDPos(text)
	if err != nil || at.String() != saved.String() {
		return fmt.Sprintf("the binlog's GTID position at its saved place %s:%d is %q, the saved one %q: another history (RESET MASTER, or another server's data)", file, pos, text, saved)
	}
	return ""
}

// placeText names a place in the binlog.
func placeText(p gomysql.Position) string { return fmt.Sprintf("%s:%d", p.Name, p.Pos) }

// readFailed reports whether err is the server's refusal to stream the
// binlog from a place (error 1236).
func readFailed(err error) bool {
	var me *gomysql.MyError
	return errors.As(err, &me) && me.Code == gomysql.ER_MASTER_FATAL_ERROR_READING_BINLOG
}

// relayStream is what a Source's session knows of its stream.
type relayStream struct {
	s          *relaySource
	h          follow.Handler
	db         string
	byName     map[string]int // a table's index, by its name as the binlog spells it
	keys       []string
	forms      []*keyForm
	identities string // identitiesText of the session's tables
	route      string // of the Source's heartbeat rows
	token      string // of this session's heartbeats
	file       string // the binlog file the stream is in
	gtid       gtidPos
	tokDomain  uint32           // the GTID domain of writers' tokens (Origin.TokenStream)
	serverID   uint32           // the server's @@server_id, which the saved place names
	at         gomysql.Position // where the stream started
	readConn   *client.Conn     // the session's connection for reads, idle while it streams
	runCtx     context.Context

	// The open transaction.
	tx       *follow.Commit
	touched  []bool
	txKeys   int
	overflow bool
	inTx     bool // a BEGIN opened it: its statements are not events of their own

	fromSaved bool // the stream began at the relay's saved place
	sawGTID   bool // a GTID event has begun a transaction in this stream

	// Commits held until visible, in binlog order, with the number of
	// events received when each came (visibility).
	held   []*follow.Commit
	heldAt []uint64
	recv   uint64

	need, free atomic.Uint64 // the last commit passed to the handler; a position before which nothing waits
	places     *placeLog

	beatSeq  int64
	out      []time.Time // heartbeats written and not back, oldest first: seq beatSeq-len(out)+1 ...
	probing  bool        // a heartbeat (or probe) is being written
	endAfter uint64      // end the session once everything up to it is passed on (DDL changed a table); 0: none
	saidMeta bool        // a table map without column names was logged
}

// streamEvent is an event of the stream, or its error.
type streamEvent struct {
	ev  *replication.BinlogEvent
	err error
}

// write is a heartbeat (or probe) to write: its seq, the number of
// events received before it began, and whether it is a heartbeat (it
// carries the tables' identities) or only a probe.
type write struct {
	seq    int64
	covers uint64
	beat   bool
}

// run passes on the stream until it fails or ctx ends.
func (st *relayStream) run(ctx context.Context, read *client.Conn, stream *replication.BinlogStreamer, hb *client.Conn, beat, probe *client.Stmt, file string) error {
	s := st.s
	loop, end := context.WithCancelCause(ctx)
	defer end(nil)
	events := make(chan streamEvent)
	writes := make(chan write, 1)
	written := make(chan uint64, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer func() {
		end(nil)
		_ = hb.SetDeadline(time.Now()) // a write in progress fails now
	}()
	wg.Go(func() { // the stream's events; GetEvent leaves an event it did not return in the streamer
		for {
			ev, err := stream.GetEvent(loop)
			if loop.Err() != nil {
				return
			}
			select {
			case events <- streamEvent{ev, err}:
			case <-loop.Done():
				return
			}
			if err != nil {
				return
			}
		}
	})
	rowID := int64(fnv64(st.route) >> 2)
	wg.Go(func() { // the heartbeats and probes, the saved place and the sweep of stale control rows
		saved, swept := uint64(0), time.Time{}
		lastSave := time.Time{}
		for {
			select {
			case <-loop.Done():
				return
			case w := <-writes:
				_ = hb.SetDeadline(time.Now().Add(s.deadline))
				stmt := probe
				if w.beat {
					stmt = beat
				}
				if _, err := stmt.Execute(rowID, st.route, st.token+" "+strconv.FormatInt(w.seq, 10)); err != nil {
					end(fmt.Errorf("mysql: relay: write a heartbeat: %w", privilege(err)))
					return
				}
				// Returned: the server has made it visible, and with it
				// every transaction before it in the binlog.
				written <- w.covers
				now := time.Now()
				if now.Sub(lastSave) >= s.heartbeat {
					lastSave = now
					if pos, gtid, ok := st.savable(); ok && pos != saved {
						f, off := decodePos(pos, file)
						if _, err := hb.Execute("INSERT INTO `"+relayTable+"` (name, server_id, file, pos, gtid_pos) VALUES (?, ?, ?, ?, ?)"+
							" ON DUPLICATE KEY UPDATE server_id = VALUES(server_id), file = VALUES(file), pos = VALUES(pos), gtid_pos = VALUES(gtid_pos), updated = NOW(6)",
							s.name, st.serverID, f, off, gtid); err != nil {
							end(fmt.Errorf("mysql: relay: save its place: %w", privilege(err)))
							return
						}
						saved = pos
					}
				}
				if now.Sub(swept) >= staleControl/60 {
					swept = now
					if _, err := hb.Execute("DELETE FROM `"+controlTable+"` WHERE updated < NOW(6) - INTERVAL ? SECOND LIMIT 1000", int64(staleControl.Seconds())); err != nil {
						end(fmt.Errorf("mysql: relay: delete stale control rows: %w", privilege(err)))
						return
					}
				}
			}
		}
	})
	st.readConn, st.runCtx = read, ctx
	last, next := time.Now(), time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-loop.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return context.Cause(loop)
		case e := <-events:
			if e.err != nil {
				return streamError(e.err, st.at, s.serverID)
			}
			st.recv++
			if err := st.event(e.ev); err != nil {
				return err
			}
			// Time the handler took (publishing a big transaction) is
			// not the connection's silence.
			last = time.Now()
		case covers := <-written:
			st.probing = false
			began := time.Now()
			if err := st.release(ctx, covers); err != nil {
				return err
			}
			last = last.Add(time.Since(began))
		case <-timer.C:
		}
		now := time.Now()
		if st.endAfter != 0 && len(st.held) == 0 && st.need.Load() >= st.endAfter {
			return fmt.Errorf("%w: a relayed table was altered, renamed or made again: the next session streams the table its name names now", errTableChanged)
		}
		if len(st.out) > 0 && now.Sub(last) > s.deadline {
			return fmt.Errorf("mysql: relay: nothing arrived on the binlog stream for %v with a heartbeat out: the connection is dead", now.Sub(last).Round(time.Millisecond))
		}
		if s.recheck.Load() {
			next = now
		}
		// One write at a time: a heartbeat when one is due (it is the
		// probe too), a probe as soon as a commit is held.
		if due := !now.Before(next); !st.probing && (due || len(st.held) > 0) {
			if due {
				s.recheck.Store(false) // before the write: a Recheck after it gets a heartbeat of its own
				next = now.Add(s.heartbeat)
			}
			st.beatSeq++
			writes <- write{seq: st.beatSeq, covers: st.recv, beat: due}
			st.probing = true
			st.out = append(st.out, now)
		}
		wake := next
		if t := last.Add(s.deadline + time.Millisecond); len(st.out) > 0 && t.Before(wake) {
			wake = t
		}
		timer.Reset(max(time.Until(wake), time.Millisecond))
	}
}

// savable returns the place the Source may save: what the handler
// confirmed, or, once it confirmed every commit passed to it, the
// position before which nothing waits; and the GTID position there.
//
// It reads free, then need, then acked: the stream's goroutine moves need
// to a commit before it moves free past it, so a free that is past a
// commit comes with a need at that commit or later, which acked must have
// reached before free counts.
func (st *relayStream) savable() (uint64, string, bool) {
	free := st.free.Load()
	need := st.need.Load()
	acked := st.s.acked.Load()
	pos := acked
	if acked >= need {
		pos = max(acked, free)
	}
	return st.places.at(pos)
}

// event handles one binlog event.
func (st *relayStream) event(ev *replication.BinlogEvent) error {
	switch e := ev.Event.(type) {
	case *replication.RotateEvent:
		st.file = string(e.NextLogName)
	case *replication.MariadbGTIDEvent:
		st.sawGTID = true
		st.begin()
		st.gtid[e.GTID.DomainID] = gtid{domain: e.GTID.DomainID, server: e.GTID.ServerID, seq: e.GTID.SequenceNumber}
	case *replication.GTIDEvent:
		return fmt.Errorf("%w: a MySQL GTID event: only MariaDB is supported", ErrSetup)
	}
	if st.fromSaved && !st.sawGTID {
		// The saved place is where a transaction ended: what follows it
		// in this history begins with a GTID event.
		switch ev.Event.(type) {
		case *replication.RowsEvent, *replication.TableMapEvent, *replication.XIDEvent, *replication.QueryEvent:
			return fmt.Errorf("%w: the stream from the relay's saved place %s:%d begins with a %v event, not a transaction", errHistory, st.at.Name, st.at.Pos, ev.Header.EventType)
		}
	}
	switch e := ev.Event.(type) {
	case *replication.RowsEvent:
		if st.tx == nil {
			st.begin()
		}
		return st.rows(ev.Header.EventType, e)
	case *replication.XIDEvent:
		return st.commit(ev.Header.LogPos)
	case *replication.QueryEvent:
		return st.query(string(e.Query), ev.Header.LogPos)
	}
	return nil
}

// begin opens a transaction.
func (st *relayStream) begin() {
	st.tx = &follow.Commit{Tables: make([]follow.Changes, len(st.keys))}
	st.touched = make([]bool, len(st.keys))
	st.txKeys, st.overflow, st.inTx = 0, false, false
}

// query handles a statement the binlog carries as text: BEGIN and COMMIT,
// DDL, and the writes of a session in STATEMENT format.
func (st *relayStream) query(q string, end uint32) error {
	q = strings.TrimSpace(q)
	upper := strings.ToUpper(q)
	switch {
	case upper == "BEGIN":
		if st.tx == nil {
			st.begin()
		}
		st.inTx = true
		return nil
	case upper == "COMMIT":
		return st.commit(end)
	case upper == "ROLLBACK":
		st.tx, st.inTx = nil, false
		return nil
	case strings.HasPrefix(upper, "XA ") || strings.HasPrefix(upper, "SAVEPOINT") || strings.HasPrefix(upper, "ROLLBACK TO"):
		if st.tx != nil {
			for i := range st.touched {
				st.touched[i] = st.touched[i] || st.txKeys > 0
			}
			st.overflow = st.overflow || st.txKeys > 0
		}
		return nil
	}
	// A write in statement format (a session's binlog_format other than
	// ROW) may change a table it does not name (through a view, a
	// trigger, a procedure): every table's followers read it again.
	every := strings.HasPrefix(upper, "DROP DATABASE") || strings.HasPrefix(upper, "DROP SCHEMA") || statementWrite(upper)
	var named []int
	for name, i := range st.byName {
		if every || nameIn(q, name) {
			named = append(named, i)
		}
	}
	if len(named) > 0 {
		// DDL on a table (ALTER, RENAME, DROP, CREATE, TRUNCATE), or a
		// write in statement format: its rows are not in the binlog. The
		// table's followers read it again.
		if st.tx == nil {
			st.begin()
		}
		for _, i := range named {
			st.tx.Tables[i].Incomplete = true
			st.touched[i] = true
		}
	}
	if st.inTx {
		return nil // a statement of a transaction: its commit comes
	}
	// A statement of its own (DDL): its end is a place in the binlog.
	if err := st.commit(end); err != nil {
		return err
	}
	if len(named) > 0 && st.endAfter == 0 && st.changed(named) {
		pos, err := encodePos(st.file, end)
		if err != nil {
			return err
		}
		st.endAfter = pos
	}
	return nil
}

// statementWrite reports whether upper, a statement the binlog carries as
// text, in upper case, writes rows: in ROW format the server logs rows,
// so this is a session that logs its writes as statements.
func statementWrite(upper string) bool {
	for _, w := range []string{"INSERT", "UPDATE", "DELETE", "REPLACE", "LOAD", "CALL", "WITH", "DO ", "EXECUTE", "HANDLER"} {
		if strings.HasPrefix(upper, w) {
			return true
		}
	}
	return false
}

// nameIn reports whether statement q names table (as a word).
func nameIn(q, table string) bool {
	re, err := regexp.Compile(`(?i)(^|[^A-Za-z0-9_$])` + regexp.QuoteMeta(table) + `($|[^A-Za-z0-9_$])`)
	return err != nil || re.MatchString(q)
}

// changed reports whether a table of named is not, now, the table the
// session began with (its identity, as the session's heartbeat row
// sees it), or cannot be read.
func (st *relayStream) changed(named []int) bool {
	c := st.readConn
	_ = c.SetDeadline(time.Now().Add(st.s.deadline))
	defer c.SetDeadline(time.Time{}) //nolint:errcheck
	ids := strings.Split(st.identities, "|")
	withID := !strings.HasPrefix(ids[0], "- ")
	for _, i := range named {
		t := st.s.tables[i]
		id, err := readIdentity(c, st.db, t.Table, t.Key, withID)
		if err != nil || id.String() != ids[i] {
			return true
		}
		col, err := describe(c, st.db, t.Table, t.Key)
		if err != nil || col.followable(t.Table) != nil {
			return true
		}
	}
	return false
}

// rows holds the keys of a rows event of a table, the tags of the tag
// table and the control rows, until the commit.
func (st *relayStream) rows(t replication.EventType, e *replication.RowsEvent) error {
	if string(e.Table.Schema) != st.db {
		return nil
	}
	name := string(e.Table.Table)
	switch name {
	case controlTable:
		return st.controlRows(t, e)
	case st.s.d.tagTable:
		return st.tagRows(t, e)
	}
	i, ok := st.byName[name]
	if !ok {
		return nil
	}
	st.touched[i] = true
	ch := &st.tx.Tables[i]
	if ch.Incomplete || st.overflow {
		return nil
	}
	k := columnIndex(e.Table, st.keys[i])
	if k < 0 {
		if !st.saidMeta {
			st.saidMeta = true
			st.s.log.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: relay finds no key column by name in the binlog's table map (binlog_row_metadata was not FULL when it was written); the table's followers read it again",
				slog.String("table", name), slog.String("key", st.keys[i]))
		}
		ch.Incomplete = true
		return nil
	}
	key := func(row []any) (string, bool) {
		if k >= len(row) || row[k] == nil {
			// The key column is NOT NULL (followable): nil is a row image
			// without it, which a session's binlog_row_image other than
			// FULL writes. What the row's key is, is not in the binlog:
			// the followers read the table.
			ch.Incomplete = true
			return "", false
		}
		text, ok, err := st.forms[i].fromRow(row[k])
		if err != nil {
			ch.Incomplete = true // a key the form cannot read: the followers read the table
		}
		return text, ok && err == nil
	}
	add := func(into *[]string, text string) {
		if st.txKeys++; st.txKeys > maxTxKeys {
			st.overflow = true
			for j := range st.tx.Tables {
				st.tx.Tables[j].Creates, st.tx.Tables[j].Deletes = nil, nil
			}
			return
		}
		*into = append(*into, text)
	}
	switch kindOf(t) {
	case insertRows, deleteRows:
		into := &ch.Creates
		if kindOf(t) == deleteRows {
			into = &ch.Deletes
		}
		for _, row := range e.Rows {
			if text, ok := key(row); ok && !st.overflow {
				add(into, text)
			}
		}
	case updateRows:
		if len(e.Rows)%2 != 0 {
			ch.Incomplete = true
			return nil
		}
		for j := 0; j < len(e.Rows) && !st.overflow; j += 2 {
			before, okB := key(e.Rows[j])
			after, okA := key(e.Rows[j+1])
			if okB == okA && before == after {
				continue // the key did not change
			}
			if okB {
				add(&ch.Deletes, before)
			}
			if okA {
				add(&ch.Creates, after)
			}
		}
	default:
		ch.Incomplete = true
	}
	return nil
}

// columnIndex returns the index of column name in the table map's rows,
// by the names binlog_row_metadata=FULL writes; -1 if it has none.
func columnIndex(m *replication.TableMapEvent, name string) int {
	for i, n := range m.ColumnName {
		if strings.EqualFold(string(n), name) {
			return i
		}
	}
	return -1
}

// controlRows holds the control rows of the open transaction: the
// inserted rows, and the updated rows' after images.
func (st *relayStream) controlRows(t replication.EventType, e *replication.RowsEvent) error {
	first, step := 0, 1
	switch kindOf(t) {
	case insertRows:
	case updateRows:
		first, step = 1, 2
	default:
		return nil
	}
	route, payload, seen := columnIndex(e.Table, "route"), columnIndex(e.Table, "payload"), columnIndex(e.Table, "seen")
	if route < 0 || payload < 0 || seen < 0 {
		return nil
	}
	text := func(v any) string {
		switch v := v.(type) {
		case string:
			return strings.Clone(v)
		case []byte:
			return string(v)
		}
		return ""
	}
	for i := first; i < len(e.Rows); i += step {
		row := e.Rows[i]
		if max(route, payload, seen) >= len(row) {
			continue
		}
		r, p, sn := text(row[route]), text(row[payload]), text(row[seen])
		if r == st.route {
			if err := st.back(p, sn); err != nil {
				return err
			}
			continue
		}
		id, _ := follow.ParseTableIdentity(sn)
		st.tx.Controls = append(st.tx.Controls, follow.Control{Route: r, Payload: p, Table: id})
	}
	return nil
}

// back records that a heartbeat of the Source's came back, with the
// tables' identities as its statement saw them.
func (st *relayStream) back(payload, seen string) error {
	token, seqText, _ := strings.Cut(payload, " ")
	seq, err := strconv.ParseInt(seqText, 10, 64)
	if token != st.token || err != nil {
		return nil // an earlier session's, or another process's
	}
	if seen != "" && seen != st.identities { // "": a probe, which carries none
		return fmt.Errorf("%w: a relayed table was renamed, dropped, made again or altered while the relay streamed (identities %s, were %s)",
			errTableChanged, seen, st.identities)
	}
	first := st.beatSeq - int64(len(st.out)) + 1
	if n := seq - first + 1; n > 0 && n <= int64(len(st.out)) {
		st.out = st.out[n:]
	}
	return nil
}

// tagRows holds the tags of the open transaction: the tag table's
// inserted rows.
func (st *relayStream) tagRows(t replication.EventType, e *replication.RowsEvent) error {
	k := columnIndex(e.Table, "tag")
	if kindOf(t) != insertRows || k < 0 {
		return nil
	}
	for _, row := range e.Rows {
		if k >= len(row) {
			continue
		}
		switch v := row[k].(type) {
		case []byte:
			st.tx.Tags = append(st.tx.Tags, append([]byte(nil), v...))
		case string:
			st.tx.Tags = append(st.tx.Tags, []byte(v))
		}
	}
	return nil
}

// commit ends the open transaction at end: it is held until visible if it
// changed a table, or behind those held; passed on at once if it carries
// only control rows and nothing is held; and skipped otherwise.
func (st *relayStream) commit(end uint32) error {
	tx := st.tx
	st.tx, st.inTx = nil, false
	if st.endAfter != 0 {
		return nil // after DDL that changed a table: the next session streams it
	}
	pos, err := encodePos(st.file, end)
	if err != nil {
		return err
	}
	st.places.add(pos, st.gtid.String())
	if tx == nil {
		if len(st.held) == 0 {
			st.free.Store(pos)
		}
		return nil
	}
	changed := false
	for i := range tx.Tables {
		if st.touched[i] && st.overflow {
			tx.Tables[i].Incomplete = true
		}
		changed = changed || tx.Tables[i].Touched()
	}
	if !changed && len(tx.Controls) == 0 {
		if len(st.held) == 0 {
			st.free.Store(pos)
		}
		return nil
	}
	tx.Pos, tx.Token = pos, st.gtid[st.tokDomain].seq
	if !changed && len(st.held) == 0 {
		return st.deliver(tx)
	}
	if changed {
		st.s.waits.Add(1)
	}
	st.held = append(st.held, tx)
	st.heldAt = append(st.heldAt, st.recv)
	return nil
}

// release passes on the commits held that a probe begun after them has
// made visible: the probe's statement returned, so every transaction
// before it in the binlog is visible (MariaDB commits in binlog order).
func (st *relayStream) release(_ context.Context, covers uint64) error {
	n := 0
	for n < len(st.held) && st.heldAt[n] <= covers {
		n++
	}
	for i := range n {
		if err := st.deliver(st.held[i]); err != nil {
			return err
		}
		st.held[i] = nil
	}
	st.held = st.held[:copy(st.held, st.held[n:])]
	st.heldAt = st.heldAt[:copy(st.heldAt, st.heldAt[n:])]
	return nil
}

// deliver passes c on to the handler.
func (st *relayStream) deliver(c *follow.Commit) error {
	if err := st.h.Commit(st.runCtx, c); err != nil {
		return err
	}
	st.need.Store(c.Pos)
	st.s.commits.Add(1)
	return nil
}

// fnv64 is FNV-1a of s.
func fnv64(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// placeLog remembers the GTID position at the end of each transaction
// streamed, for the place the Source saves, until it is saved.
type placeLog struct {
	mu   sync.Mutex // protects the entries
	pos  []uint64
	gtid []string
}

// maxPlaces bounds a placeLog: past it, the oldest half is dropped (a
// place no longer found is saved later, at a later position).
const maxPlaces = 1 << 14

func newPlaceLog() *placeLog { return &placeLog{} }

func (p *placeLog) add(pos uint64, gtid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pos) >= maxPlaces {
		n := copy(p.pos, p.pos[maxPlaces/2:])
		p.pos = p.pos[:n]
		p.gtid = p.gtid[:copy(p.gtid, p.gtid[maxPlaces/2:])]
	}
	p.pos = append(p.pos, pos)
	p.gtid = append(p.gtid, gtid)
}

// at returns the last place at or before pos, and forgets those before it.
func (p *placeLog) at(pos uint64) (uint64, string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := -1
	for j, q := range p.pos {
		if q > pos {
			break
		}
		i = j
	}
	if i < 0 {
		return 0, "", false
	}
	at, g := p.pos[i], p.gtid[i]
	p.pos = p.pos[:copy(p.pos, p.pos[i:])]
	p.gtid = p.gtid[:copy(p.gtid, p.gtid[i:])]
	return at, g, true
}
