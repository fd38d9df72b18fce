package mysql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// quiet is go-mysql's logger: the Follower says what matters itself.
var quiet = slog.New(slog.DiscardHandler)

// maxTxKeys is the most keys one transaction's changes may hold until its
// commit; a larger one ends the session at its commit, for a full read.
// A variable for the tests.
var maxTxKeys = 1 << 20

// afterRead, if set (by tests), runs between the table's read and the
// start of the binlog stream.
var afterRead func()

var errResync = errors.New("mysql: the Loader asked for a fresh guard")

// dial opens a connection whose reads and writes fail at once when ctx
// ends. Its handshake must be done within the heartbeat deadline: a
// server (or a route) that accepts and then says nothing would hold the
// session, and Run, for good. closeConn closes it; call it once, after
// every use has returned.
func (f *Follower[K]) dial(ctx context.Context) (c *client.Conn, closeConn func(), err error) {
	c, err = client.ConnectWithDialer(ctx, "tcp", f.srv.addr(), f.srv.user, f.srv.password, f.srv.db, f.dialer())
	if err != nil {
		return nil, nil, fmt.Errorf("mysql: connect to %s as %s: %w", f.srv.addr(), f.srv.user, privilege(err))
	}
	_ = c.SetDeadline(time.Time{})
	// A deadline, not Close: Close writes to the connection, which may be
	// in use by another goroutine.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	return c, func() { stop(); c.Close() }, nil
}

// dialer returns a dialer whose connections must be done with what they
// are doing within the heartbeat deadline, until their user clears it.
func (f *Follower[K]) dialer() client.Dialer {
	d := &net.Dialer{Timeout: f.deadline}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, network, addr)
		if err == nil {
			_ = nc.SetDeadline(time.Now().Add(f.deadline))
		}
		return nc, err
	}
}

// session connects, reads the table in a consistent snapshot, streams the
// binlog from the snapshot's position and applies each committed change
// until an error. followed is how long it followed: from the marker's
// return to its end, 0 if the marker never came back.
func (f *Follower[K]) session(parent context.Context) (followed time.Duration, err error) {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	requests := f.feed.Requests()
	go func() {
		select {
		case <-requests:
			cancel(errResync)
		case <-ctx.Done():
		}
	}()
	var since time.Time
	err = f.follow(ctx, &since)
	if !since.IsZero() {
		followed = time.Since(since)
	}
	if context.Cause(ctx) == errResync {
		return followed, errResync
	}
	if err != nil && ctx.Err() != nil && parent.Err() == nil {
		err = context.Cause(ctx)
	}
	return followed, err
}

func (f *Follower[K]) follow(ctx context.Context, following *time.Time) error {
	read, closeRead, err := f.dial(ctx)
	if err != nil {
		return err
	}
	defer closeRead()
	if err := checkServer(read); err != nil {
		return err
	}
	col, err := describe(read, f.srv.db, f.table, f.key)
	if err != nil {
		return err
	}
	if err := col.followable(f.table); err != nil {
		return err
	}
	if err := f.useForm(read, col); err != nil {
		return err
	}
	hbOrdinal, err := f.heartbeatTable(read)
	if err != nil {
		return err
	}
	hb, closeHB, err := f.dial(ctx)
	if err != nil {
		return err
	}
	defer closeHB()
	stmt, err := hb.Prepare("INSERT INTO `" + f.hbTable + "` (id, beat) VALUES (?, ?) ON DUPLICATE KEY UPDATE beat = VALUES(beat)")
	if err != nil {
		return fmt.Errorf("mysql: prepare the heartbeat: %w", privilege(err))
	}
	defer stmt.Close()

	f.state.Store(int32(Resyncing))
	var at gomysql.Position
	began := time.Now()
	var keys int64
	err = f.feed.Resync(ctx, func(ctx context.Context, add func(K) error) error {
		var gtid string
		at, gtid, keys, err = f.readAll(read, col, add)
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.position = fmt.Sprintf("%s:%d gtid %s", at.Name, at.Pos, gtid)
		f.mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	f.reads.Add(1)
	f.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: follower read the table",
		slog.Int64("keys", keys), slog.Duration("took", time.Since(began)), slog.String("position", fmt.Sprintf("%s:%d", at.Name, at.Pos)))

	if afterRead != nil {
		afterRead()
	}
	// The stream's connection has the deadline of its handshake and
	// registration until StartSync returns, then none: the stream is idle
	// while the table is, and its heartbeats tell dead from idle.
	var streamConn net.Conn
	dial := f.dialer()
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID: f.serverID, Flavor: gomysql.MariaDBFlavor,
		Host: f.srv.host, Port: f.srv.port, User: f.srv.user, Password: f.srv.password,
		DisableRetrySync: true, // a lost stream ends the session: the next one reads the table
		Logger:           quiet,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := dial(ctx, network, addr)
			streamConn = nc // StartSync dials on this goroutine
			return nc, err
		},
	})
	defer syncer.Close()
	stream, err := syncer.StartSync(at)
	if err != nil {
		return streamError(err, at, f.serverID)
	}
	if streamConn != nil {
		_ = streamConn.SetDeadline(time.Time{})
	}
	s := &session[K]{f: f, at: at, col: col, hbOrdinal: hbOrdinal, token: newToken(), following: following}
	return s.run(ctx, stream, hb, stmt)
}

// readAll reads every key of the table in a consistent snapshot into add,
// and returns the binlog position (and GTID) the snapshot corresponds to:
// the read sees exactly the transactions the binlog holds before it.
// The position comes from the snapshot's own transaction
// (binlog_snapshot_file and _position): SHOW MASTER STATUS read after it
// names a later position, and the stream would skip the commits between.
func (f *Follower[K]) readAll(read *client.Conn, col column, add func(K) error) (at gomysql.Position, gtid string, keys int64, err error) {
	for _, q := range []string{"SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ", "START TRANSACTION WITH CONSISTENT SNAPSHOT"} {
		if _, err := read.Execute(q); err != nil {
			return at, "", 0, fmt.Errorf("mysql: read the table: %s: %w", q, err)
		}
	}
	defer read.Execute("ROLLBACK") //nolint:errcheck // a read-only transaction; a broken connection ends the session anyway
	r, err := read.Execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
	if err != nil {
		return at, "", 0, fmt.Errorf("mysql: read the snapshot's binlog position: %w", err)
	}
	for i := range r.RowNumber() {
		name, _ := r.GetString(i, 0)
		v, _ := r.GetString(i, 1)
		switch strings.ToLower(name) {
		case "binlog_snapshot_file":
			at.Name = v
		case "binlog_snapshot_position":
			p, _ := strconv.ParseUint(v, 10, 32)
			at.Pos = uint32(p)
		}
	}
	if at.Name == "" || at.Pos == 0 {
		return at, "", 0, fmt.Errorf("%w: the server has no binlog_snapshot_file/_position status (MariaDB has; MySQL 8's performance_schema.log_status is not supported yet)", ErrSetup)
	}
	if !validFile.MatchString(at.Name) {
		return at, "", 0, fmt.Errorf("mysql: binlog file name %q", at.Name)
	}
	if r, err := read.Execute(fmt.Sprintf("SELECT BINLOG_GTID_POS('%s', %d)", at.Name, at.Pos)); err == nil {
		gtid, _ = r.GetString(0, 0)
	}
	var res gomysql.Result
	defer res.Close()
	err = read.ExecuteSelectStreaming("SELECT `"+f.key+"` FROM `"+f.table+"`", &res, func(row []gomysql.FieldValue) error {
		if row[0].Type == gomysql.FieldValueTypeNull {
			return nil
		}
		text, err := f.form.canon(fieldText(&row[0]))
		if err != nil {
			return err
		}
		k, err := f.parse(text)
		if err != nil {
			return fmt.Errorf("mysql: parse key %q of %s: %w", text, f.key, err)
		}
		keys++
		return add(k)
	}, nil)
	if err != nil {
		return at, "", 0, fmt.Errorf("mysql: read the table: %w", privilege(err))
	}
	// The layout the stream's rows are decoded by: read after the
	// position, so that a DDL statement after it is in the stream (and
	// ends the session), and one before it shows as a difference from
	// what the session began with.
	now, err := describe(read, f.srv.db, f.table, f.key)
	if err != nil {
		return at, "", 0, err
	}
	if !now.same(col) {
		return at, "", 0, fmt.Errorf("%w: the table's layout changed during the read", errTableChanged)
	}
	return at, gtid, keys, nil
}

// fieldText is the text of a value of the read.
func fieldText(v *gomysql.FieldValue) string {
	switch v.Type {
	case gomysql.FieldValueTypeSigned:
		return strconv.FormatInt(v.AsInt64(), 10)
	case gomysql.FieldValueTypeUnsigned:
		return strconv.FormatUint(v.AsUint64(), 10)
	case gomysql.FieldValueTypeFloat:
		return strconv.FormatFloat(v.AsFloat64(), 'g', -1, 64) // no key column is a float: canon refuses it
	}
	return string(v.AsString())
}

var validFile = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// checkServer returns an error wrapping ErrSetup, saying what to change,
// if the server's binlog cannot show the table's changes.
func checkServer(c *client.Conn) error {
	r, err := c.Execute("SELECT @@GLOBAL.log_bin, @@GLOBAL.binlog_format, @@GLOBAL.binlog_row_image")
	if err != nil {
		return fmt.Errorf("mysql: read the server's binlog settings: %w", err)
	}
	logBin, _ := r.GetString(0, 0)
	format, _ := r.GetString(0, 1)
	image, _ := r.GetString(0, 2)
	switch {
	case logBin != "1":
		return fmt.Errorf("%w: the binary log is off: start the server with --log-bin (and --binlog-format=ROW)", ErrSetup)
	case !strings.EqualFold(format, "ROW"):
		return fmt.Errorf("%w: binlog_format is %s, the binlog must carry rows: SET GLOBAL binlog_format = 'ROW' and set binlog_format=ROW in the server's configuration (sessions open before keep theirs)", ErrSetup, format)
	case !strings.EqualFold(image, "FULL"):
		return fmt.Errorf("%w: binlog_row_image is %s, an update must carry the key before and after: SET GLOBAL binlog_row_image = 'FULL' and in the server's configuration", ErrSetup, image)
	}
	return nil
}

// useForm makes the key column's form for col, reading a collation's
// weights from the server once per collation, and installs its key rule
// in the Loader when it changed.
func (f *Follower[K]) useForm(read *client.Conn, col column) error {
	if f.form != nil && f.formCol.same(col) {
		return nil
	}
	form, err := formOf(col, func(collation string) (*weights, error) {
		if w := f.weights[collation]; w != nil {
			return w, nil
		}
		w, err := loadWeights(read, collation)
		if err != nil {
			return nil, err
		}
		f.weights[collation] = w
		return w, nil
	})
	if err != nil {
		return err
	}
	f.form, f.formCol = form, col
	f.feed.SetKeyRule(func(k K) (K, error) {
		text, err := form.canon(f.text(k))
		if err != nil {
			var zero K
			return zero, err
		}
		return f.parse(text)
	})
	return nil
}

// heartbeatTable creates the heartbeat table if missing and returns the
// position of its beat column. It writes no DDL when the table exists:
// every follower's stream carries the statement, and one whose table's
// name is in its text would read its table again.
func (f *Follower[K]) heartbeatTable(c *client.Conn) (int, error) {
	col, err := describe(c, f.srv.db, f.hbTable, "beat")
	if errors.Is(err, ErrSetup) {
		if _, err := c.Execute("CREATE TABLE IF NOT EXISTS `" + f.hbTable + "` (id INT UNSIGNED NOT NULL PRIMARY KEY, beat VARCHAR(100) NOT NULL) ENGINE=InnoDB"); err != nil {
			return 0, fmt.Errorf("mysql: create the heartbeat table %s: %w", f.hbTable, privilege(err))
		}
		col, err = describe(c, f.srv.db, f.hbTable, "beat")
	}
	if err != nil {
		return 0, err
	}
	if !strings.EqualFold(col.engine, "InnoDB") {
		return 0, fmt.Errorf("%w: the heartbeat table %s must be InnoDB", ErrSetup, f.hbTable)
	}
	return col.ordinal, nil
}

// privilege wraps ErrSetup around a server's refusal for want of a
// privilege, saying which.
func privilege(err error) error {
	var me *gomysql.MyError
	if !errors.As(err, &me) {
		return err
	}
	switch me.Code {
	case gomysql.ER_ACCESS_DENIED_ERROR:
		return fmt.Errorf("%w: %v (a wrong user or password; for the binlog stream, also a user without REPLICATION SLAVE)", ErrSetup, err)
	case gomysql.ER_TABLEACCESS_DENIED_ERROR, gomysql.ER_COLUMNACCESS_DENIED_ERROR, gomysql.ER_DBACCESS_DENIED_ERROR, gomysql.ER_SPECIFIC_ACCESS_DENIED_ERROR:
		return fmt.Errorf("%w: %v (GRANT SELECT ON the table, and CREATE, INSERT and UPDATE ON the heartbeat table, TO the follower's user)", ErrSetup, err)
	}
	return err
}

// streamError says what a failure of the binlog stream means.
func streamError(err error, at gomysql.Position, id uint32) error {
	var me *gomysql.MyError
	if errors.As(err, &me) {
		switch me.Code {
		case gomysql.ER_MASTER_FATAL_ERROR_READING_BINLOG:
			return fmt.Errorf("mysql: the binlog from %s:%d cannot be read (purged, or the binlog was reset): %w", at.Name, at.Pos, err)
		case gomysql.ER_ACCESS_DENIED_ERROR:
			return fmt.Errorf("%w: the binlog stream was refused: %v: the server answers so to a user without the REPLICATION SLAVE privilege, not only to a wrong password: GRANT REPLICATION SLAVE ON *.* TO the follower's user", ErrSetup, err)
		case 4052: // ER_SLAVE_SAME_ID (MariaDB)
			return fmt.Errorf("mysql: another binlog reader connected with server id %d and the server dropped this one: give each Follower an id of its own (WithServerID): %w", id, err)
		}
	}
	return fmt.Errorf("mysql: binlog stream: %w", err)
}

// session is one stream's worth of following.
type session[K comparable] struct {
	f         *Follower[K]
	at        gomysql.Position // where the stream started
	col       column
	hbOrdinal int
	token     string
	following *time.Time

	creations, deletions []K
	beats                []string // heartbeat payloads of the open transaction
	overflow             bool     // the open transaction held more than maxTxKeys keys

	seq        int64
	out        []beat // heartbeats sent and not back, oldest first
	markerSent time.Time
	last       time.Time // when anything last arrived on the stream
	next       time.Time // the next heartbeat is due
}

type beat struct {
	seq  int64
	sent time.Time
}

// newToken returns a session token: unique among sessions and processes.
func newToken() string {
	return strconv.FormatUint(uint64(time.Now().UnixNano()), 36) + "." + strconv.FormatUint(uint64(randomServerID()), 36)
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
	s.markerSent = time.Now() // before: what commits before the marker committed before it
	if err := send("S " + s.token); err != nil {
		return fmt.Errorf("mysql: write the marker: %w", privilege(err))
	}
	s.last, s.next = s.markerSent, s.markerSent.Add(f.heartbeat)
	// The heartbeats go from a goroutine of their own: a write to a
	// silent connection blocks until its deadline, and the stream must be
	// watched meanwhile.
	beats := make(chan string, 1)
	var senders sync.WaitGroup
	senders.Go(func() {
		for {
			select {
			case <-loop.Done():
				return
			case p := <-beats:
				if err := send(p); err != nil {
					end(fmt.Errorf("mysql: write a heartbeat: %w", err))
					return
				}
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
		wctx, cancel := context.WithDeadline(loop, wake)
		ev, err := stream.GetEvent(wctx)
		cancel()
		now := time.Now()
		switch {
		case loop.Err() != nil:
			return context.Cause(loop)
		case errors.Is(err, context.DeadlineExceeded):
		case err != nil:
			return streamError(err, s.at, f.serverID)
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
func (s *session[K]) tick(now time.Time, beats chan<- string) error {
	f := s.f
	waiting := len(s.out) > 0 || State(f.state.Load()) == Resyncing
	if waiting && now.Sub(s.last) > f.deadline {
		return fmt.Errorf("mysql: nothing arrived on the binlog stream for %v with a heartbeat out: the connection is dead", now.Sub(s.last).Round(time.Millisecond))
	}
	if !now.Before(s.next) {
		select {
		case beats <- "H " + s.token + "-" + strconv.FormatInt(s.seq+1, 10):
			s.seq++
			s.out = append(s.out, beat{seq: s.seq, sent: now})
			f.beats.Add(1)
		default: // the last one is still being written: it is out, and ages
		}
		s.next = now.Add(f.heartbeat)
	}
	return nil
}

// event handles one binlog event.
func (s *session[K]) event(ev *replication.BinlogEvent, now time.Time) error {
	switch e := ev.Event.(type) {
	case *replication.RowsEvent:
		return s.rows(ev.Header.EventType, e)
	case *replication.XIDEvent:
		return s.commit(now)
	case *replication.QueryEvent:
		return s.query(string(e.Query), now)
	case *replication.MariadbGTIDEvent, *replication.GTIDEvent:
		if len(s.creations)+len(s.deletions)+len(s.beats) > 0 || s.overflow {
			return errors.New("mysql: a transaction began before the last one committed")
		}
	}
	return nil
}

// query handles a statement the binlog carries as text: a transaction's
// BEGIN and COMMIT (for engines without XA), DDL, and the writes of a
// session in STATEMENT or MIXED format.
func (s *session[K]) query(q string, now time.Time) error {
	q = strings.TrimSpace(q)
	upper := strings.ToUpper(q)
	switch {
	case upper == "BEGIN":
		return nil
	case upper == "COMMIT":
		return s.commit(now)
	case upper == "ROLLBACK":
		// A transaction that wrote a non-transactional table: its
		// transactional rows were rolled back.
		s.creations, s.deletions, s.beats, s.overflow = s.creations[:0], s.deletions[:0], s.beats[:0], false
		return nil
	case strings.HasPrefix(upper, "XA ") || strings.HasPrefix(upper, "SAVEPOINT") || strings.HasPrefix(upper, "ROLLBACK TO"):
		if len(s.creations)+len(s.deletions) > 0 || strings.HasPrefix(upper, "XA COMMIT") {
			return fmt.Errorf("%w: %.60s: the follower does not follow XA transactions or savepoints in the binlog", errTableChanged, q)
		}
		return nil
	case strings.Contains(strings.ToLower(q), strings.ToLower(s.col.table)),
		strings.HasPrefix(upper, "DROP DATABASE"), strings.HasPrefix(upper, "DROP SCHEMA"):
		// DDL on the table (ALTER, RENAME, DROP, CREATE, TRUNCATE), or a
		// write in statement format: its rows are not in the binlog.
		// Read the table again. (A statement that only names the table
		// in passing costs a read, never a key.)
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
		if err != nil || !ok {
			return zero, false, err
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

// commit applies the open transaction: its creations, then its deletions
// (a key created and deleted in it is never removed before it is added),
// then its heartbeats.
func (s *session[K]) commit(now time.Time) error {
	f := s.f
	if s.overflow {
		return fmt.Errorf("%w: more than %d keys", errBigTransaction, maxTxKeys)
	}
	for _, k := range s.creations {
		if err := f.feed.Apply(guarded.Change[K]{Key: k}); err != nil {
			return fmt.Errorf("mysql: apply: %w", err)
		}
	}
	for _, k := range s.deletions {
		if err := f.feed.Apply(guarded.Change[K]{Key: k, Deleted: true}); err != nil {
			return fmt.Errorf("mysql: apply: %w", err)
		}
	}
	f.applied.Add(int64(len(s.creations) + len(s.deletions)))
	clear(s.creations)
	clear(s.deletions)
	s.creations, s.deletions = s.creations[:0], s.deletions[:0]
	for _, p := range s.beats {
		s.control(p, now)
	}
	s.beats = s.beats[:0]
	return nil
}

// control handles this session's marker or heartbeat, back at now behind
// every change committed before it was written.
func (s *session[K]) control(payload string, now time.Time) {
	f := s.f
	op, rest, _ := strings.Cut(payload, " ")
	switch op {
	case "S":
		if rest == s.token && State(f.state.Load()) == Resyncing {
			f.rtt.Store(int64(now.Sub(s.markerSent)))
			f.grant(s.markerSent)
			f.state.Store(int32(Following))
			*s.following = now
		}
	case "H":
		token, seqText, _ := strings.Cut(rest, "-")
		seq, err := strconv.ParseInt(seqText, 10, 64)
		if token != s.token || err != nil {
			return
		}
		for i, b := range s.out {
			if b.seq == seq {
				s.out = s.out[i+1:] // the stream is in commit order: older ones are lost
				f.rtt.Store(int64(now.Sub(b.sent)))
				if State(f.state.Load()) == Following {
					f.grant(b.sent)
				}
				return
			}
		}
	}
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
