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
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/zeebo/xxh3"
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

// sessionEnded, if set (by tests), gets the position the next session
// may resume from, when a session ends and leaves one.
var sessionEnded func(p resumePoint)

var errResync = errors.New("mysql: the Loader asked for a fresh guard")

// dial opens a connection whose reads and writes fail at once when ctx
// ends. Its handshake must be done within the heartbeat deadline: a
// server (or a route) that accepts and then says nothing would hold the
// session, and Run, for good. closeConn closes it; call it once, after
// every use has returned.
func (f *Follower[K]) dial(ctx context.Context) (c *client.Conn, closeConn func(), err error) {
	return dial(ctx, f.srv, f.deadline)
}

// dialer returns a dialer whose connections must be done with what they
// are doing within the heartbeat deadline, until their user clears it.
func (f *Follower[K]) dialer() client.Dialer { return dialer(f.deadline) }

// dial opens a connection to srv as Follower.dial does, whose handshake
// must be done within deadline.
func dial(ctx context.Context, srv server, deadline time.Duration) (c *client.Conn, closeConn func(), err error) {
	c, err = client.ConnectWithDialer(ctx, "tcp", srv.addr(), srv.user, srv.password, srv.db, dialer(deadline))
	if err != nil {
		return nil, nil, fmt.Errorf("mysql: connect to %s as %s: %w", srv.addr(), srv.user, privilege(err))
	}
	_ = c.SetDeadline(time.Time{})
	// A deadline, not Close: Close writes to the connection, which may be
	// in use by another goroutine.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	return c, func() { stop(); c.Close() }, nil
}

// dialer returns a dialer whose connections must be done with what they
// are doing within deadline, until their user clears it.
func dialer(deadline time.Duration) client.Dialer {
	d := &net.Dialer{Timeout: deadline}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, network, addr)
		if err == nil {
			_ = nc.SetDeadline(time.Now().Add(deadline))
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
	tagOrdinal, err := f.tagTableOrdinal(read)
	if err != nil {
		return err
	}
	src, err := readSource(read)
	if err != nil {
		return err
	}
	domain, err := tokenDomain(read)
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
	var pos gtidPos
	verify := f.resumable(ctx, src, col)
	if verify != nil {
		// Stream from the start of the last transaction applied: the
		// session checks that the binlog still holds it there, and goes
		// on after it.
		at = gomysql.Position{Name: verify.file, Pos: verify.start}
		pos = verify.pos
		f.mu.Lock()
		f.position = "resumed after " + verify.String()
		f.mu.Unlock()
	} else {
		if at, pos, err = f.read(ctx, read, col); err != nil {
			return err
		}
	}

	// The guard holds every change up to where the stream starts.
	f.startPositions(src.serverID, domain, pos)
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
		DisableRetrySync: true, // a lost stream ends the session: the next one resumes, or reads the table
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
	s := &session[K]{f: f, at: at, src: src, col: col, verify: verify, file: at.Name, pos: pos, hash: xxh3.New(),
		hbOrdinal: hbOrdinal, tagOrdinal: tagOrdinal, token: newToken(), following: following}
	return s.run(ctx, stream, hb, stmt)
}

// read reads the table into a fresh guard and returns the binlog position
// (and the GTID position at it) where the read and the stream meet. The
// deletions held for the old guard are dropped, and there is nothing to
// resume from until the stream has applied a transaction.
func (f *Follower[K]) read(ctx context.Context, read *client.Conn, col column) (at gomysql.Position, pos gtidPos, err error) {
	f.resume = nil
	f.holds.drop()
	began := time.Now()
	var keys int64
	var gtidText string
	err = f.feed.Resync(ctx, func(ctx context.Context, add func(K) error) error {
		var rerr error
		if at, gtidText, keys, rerr = f.readAll(read, col, add); rerr != nil {
			return rerr
		}
		f.mu.Lock()
		f.position = fmt.Sprintf("read at %s:%d gtid %s", at.Name, at.Pos, gtidText)
		f.readWhy = f.readReason
		f.mu.Unlock()
		return nil
	})
	if err != nil {
		return at, nil, err
	}
	if pos, err = parseGTIDPos(gtidText); err != nil {
		return at, nil, err
	}
	f.reads.Add(1)
	f.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: follower read the table",
		slog.Int64("keys", keys), slog.Duration("took", time.Since(began)), slog.String("position", fmt.Sprintf("%s:%d", at.Name, at.Pos)),
		slog.String("reason", f.readReason))
	return at, pos, nil
}

// resumable returns the position the session may stream from instead of
// reading the table, if the last session (or, at the first session to
// get this far, the snapshot file) left one and nothing the server says of itself
// refutes it (resume.go); nil otherwise, with the reason in readReason.
func (f *Follower[K]) resumable(ctx context.Context, src source, col column) *resumePoint {
	if f.resume == nil && f.snapPath != "" && !f.fileTried {
		f.fileTried = true
		f.restore(ctx, src, col)
	}
	p := f.resume
	if p == nil {
		return nil
	}
	if why := p.refuse(src, col); why != "" {
		f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower cannot resume; it reads the table",
			slog.String("position", p.String()), slog.String("reason", why))
		f.readReason = why
		f.resume = nil
		return nil
	}
	return p
}

// readAll reads every key of the table in a consistent snapshot into add,
// and returns the binlog position (and GTID) the snapshot corresponds to
// (readSnapshot).
func (f *Follower[K]) readAll(read *client.Conn, col column, add func(K) error) (at gomysql.Position, gtid string, keys int64, err error) {
	return readSnapshot(read, f.srv.db, f.table, f.key, col, f.form, func(text string) error {
		k, err := f.parse(text)
		if err != nil {
			return fmt.Errorf("mysql: parse key %q of %s: %w", text, f.key, err)
		}
		return add(k)
	})
}

// readSnapshot reads every key of db.table's column key (described as
// col) in a consistent snapshot, in form's one text, into add, and
// returns the binlog position (and GTID) the snapshot corresponds to: the
// read sees exactly the transactions the binlog holds before it.
// The position comes from the snapshot's own transaction
// (binlog_snapshot_file and _position): SHOW MASTER STATUS read after it
// names a later position, and the stream would skip the commits between.
func readSnapshot(read *client.Conn, db, table, key string, col column, form *keyForm, add func(text string) error) (at gomysql.Position, gtid string, keys int64, err error) {
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
	err = read.ExecuteSelectStreaming("SELECT `"+key+"` FROM `"+table+"`", &res, func(row []gomysql.FieldValue) error {
		if row[0].Type == gomysql.FieldValueTypeNull {
			return nil
		}
		text, err := form.canon(fieldText(&row[0]))
		if err != nil {
			return err
		}
		keys++
		return add(text)
	}, nil)
	if err != nil {
		return at, "", 0, fmt.Errorf("mysql: read the table: %w", privilege(err))
	}
	// The layout the stream's rows are decoded by: read after the
	// position, so that a DDL statement after it is in the stream (and
	// ends the session), and one before it shows as a difference from
	// what the session began with.
	now, err := describe(read, db, table, key)
	if err != nil {
		return at, "", 0, err
	}
	if !now.same(col) {
		return at, "", 0, fmt.Errorf("%w: the table's layout changed during the read", errTableChanged)
	}
	return at, gtid, keys, nil
}

// validFile is a binlog file name: it goes into SQL text.
var validFile = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

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
