package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"github.com/cuckooguard/cuckooguard/follow"
)

func (d *relayed) Connect(ctx context.Context, table, key string) (follow.Session, error) {
	if !validName.MatchString(table) || !validName.MatchString(key) {
		return nil, fmt.Errorf("%w: table %q and key column %q must be plain names (letters, digits, _ and $) of the DSN's database", ErrSetup, table, key)
	}
	deadline := time.Minute
	if t, ok := ctx.Deadline(); ok {
		deadline = time.Until(t)
	}
	// The connection outlives ctx, which bounds the handshake (the
	// dialer's deadline) and open.
	c, closeConn, err := dial(context.WithoutCancel(ctx), d.srv, deadline)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	s := &relayedSession{d: d, c: c, closeConn: closeConn, table: table, key: key, id: rand.Int64N(1<<62) + 1}
	if err := s.open(); err != nil {
		closeConn()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return s, nil
}

// relayedSession is a relayed follower's connection: it reads the table
// and writes the follower's control row.
type relayedSession struct {
	d         *relayed
	c         *client.Conn
	closeConn func()
	table     string // as given
	key       string
	col       column // as the Session found it
	id        int64  // the control row's
	emit      *client.Stmt
	origin    follow.Origin
}

// open resolves the table and prepares the control row's statement.
func (s *relayedSession) open() error {
	col, err := describe(s.c, s.d.srv.db, s.table, s.key)
	if err != nil {
		return err
	}
	s.col = col
	if s.origin, err = readOrigin(s.c, s.d.srv.db); err != nil {
		return err
	}
	if err := ensureTable(s.c, s.d.srv.db, controlTable, controlColumns); err != nil {
		return err
	}
	s.emit, err = s.c.Prepare(emitSQL(identitySQL(col.schema, col.table, s.key, canReadIDs(s.c))))
	if err != nil {
		return fmt.Errorf("mysql: prepare the control row: %w", privilege(err))
	}
	return nil
}

// withDeadline bounds what runs on the Session's connection by ctx's
// deadline (or a minute) and ends it when ctx ends.
func (s *relayedSession) withDeadline(ctx context.Context) func() {
	deadline := time.Now().Add(time.Minute)
	if t, ok := ctx.Deadline(); ok {
		deadline = t
	}
	_ = s.c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = s.c.SetDeadline(time.Now()) })
	return func() { stop(); _ = s.c.SetDeadline(time.Time{}) }
}

func (s *relayedSession) Origin(ctx context.Context) (follow.Origin, error) {
	defer s.withDeadline(ctx)()
	return readOrigin(s.c, s.d.srv.db)
}

func (s *relayedSession) Table() string { return s.col.schema + "." + s.col.table }

// Emit writes the follower's control row (one statement): the Source of
// the relay passes it on, with the identity of the table as this
// statement saw it.
func (s *relayedSession) Emit(ctx context.Context, route, payload string) error {
	defer s.withDeadline(ctx)()
	if _, err := s.emit.Execute(s.id, route, payload); err != nil {
		return fmt.Errorf("mysql: write the control row: %w", privilege(err))
	}
	return nil
}

func (s *relayedSession) Read(ctx context.Context, add func(key string) error) (follow.Seen, int64, error) {
	defer s.withDeadline(context.WithoutCancel(ctx))()
	stop := context.AfterFunc(ctx, func() { _ = s.c.SetDeadline(time.Now()) })
	defer stop()
	_ = s.c.SetDeadline(time.Time{}) // a big table takes its time; ctx ends it
	col, form, err := s.d.column(s.c, s.table, s.key)
	if err != nil {
		return nil, 0, err
	}
	at, _, n, err := readSnapshot(s.c, s.d.srv.db, s.table, s.key, col, form, add)
	if err != nil {
		return nil, n, err
	}
	pos, err := encodePos(at.Name, at.Pos)
	if err != nil {
		return nil, n, err
	}
	return snapshotSeen(pos), n, nil
}

// snapshotSeen tells the transactions a read saw: those that committed at
// or before its snapshot's binlog position.
type snapshotSeen uint64

func (p snapshotSeen) Saw(pos uint64, _ uint32) bool { return pos <= uint64(p) }

func (s *relayedSession) KeyForm(ctx context.Context, _ follow.KeyForm) (follow.KeyForm, error) {
	defer s.withDeadline(ctx)()
	col, form, err := s.d.column(s.c, s.table, s.key)
	if err != nil {
		return nil, err
	}
	return relayForm{form, col}, nil
}

// Close deletes the control row (best effort, briefly) and closes the
// connection.
func (s *relayedSession) Close() {
	_ = s.c.SetDeadline(time.Now().Add(closeWait))
	if s.emit != nil {
		_, _ = s.c.Execute("DELETE FROM `"+controlTable+"` WHERE id = ?", s.id)
	}
	s.closeConn()
}

// closeWait bounds the goodbyes to a server, on the way out.
const closeWait = 250 * time.Millisecond

// ExecIn returns tx as a [follow.Exec], for the Tag of a follower behind
// a relay (fanout.Follower.Tag): the tag is written in tx.
func ExecIn(tx Tx) follow.Exec {
	return func(ctx context.Context, query string, args ...any) error {
		if tx == nil {
			return errors.New("mysql: ExecIn: tx is nil")
		}
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}
}

var _ Tx = (*sql.Tx)(nil)
