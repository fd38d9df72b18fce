package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/follow"
)

// Relayed returns the database at dsn as the fanout module relays it: one
// relay per database holds one replication slot for all its tables
// (published with [Publish]) and publishes their changes to NATS
// JetStream; replicas follow the stream rather than the database. dsn is
// a postgres:// URL for a user with the REPLICATION attribute (the relay
// streams; its followers only connect, for their heartbeats and reads of
// the table).
//
//	db, err := postgres.Relayed(dsn)
//	relay, err := fanout.NewRelay(db, "users-api", nc, []follow.Table{{Table: "users", Key: "id"}})
//	follower, err := fanout.NewFollower(loader, nc, db, "users", "id", parse, fanout.WithRelay("users-api"))
func Relayed(dsn string) (follow.Database, error) {
	conf, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: Relayed: %w", err)
	}
	conf.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return &relayed{dsn: dsn, conf: conf}, nil
}

// relayed is a database as the fanout module relays it.
type relayed struct {
	dsn  string
	conf *pgx.ConnConfig
}

func (d *relayed) Source(name string, tables []follow.Table, c follow.SourceConfig) (follow.Source, error) {
	return newSource(d.dsn, name, tables, WithHeartbeat(c.Heartbeat), WithHeartbeatDeadline(c.Deadline), WithBackoff(c.Backoff),
		WithMaxBackoff(c.MaxBackoff), WithLogger(c.Logger), withSlotTakeover())
}

func (d *relayed) Lease(ctx context.Context, name string, length, deadline time.Duration) (follow.Lease, error) {
	l, err := acquire(ctx, d.conf, name, length, deadline)
	if l == nil || err != nil {
		return nil, err // no typed nil in the interface
	}
	return l, nil
}

func (d *relayed) Permanent(err error) bool {
	return errors.Is(err, ErrLogicalUnavailable) || errors.Is(err, ErrNotPublished) ||
		errors.Is(err, ErrKeyNotIdentity) || errors.Is(err, ErrKeyType) || errors.Is(err, ErrSlotOfAnotherDatabase)
}

func (d *relayed) KeyColumn(table, key string, deadline time.Duration) (follow.KeyColumn, error) {
	if table == "" || key == "" || deadline <= 0 {
		return nil, errors.New("postgres: KeyColumn needs a table, a key column and a deadline")
	}
	if _, err := splitColumns(key); err != nil {
		return nil, err
	}
	return &column{conf: d.conf.Copy(), table: table, key: key, timeout: deadline}, nil
}

func (d *relayed) TagStatement(content []byte) (string, []any) { return tagStatement(content) }

func (d *relayed) Teardown(ctx context.Context, name string, tables []string) (follow.Origin, error) {
	conn, err := pgx.ConnectConfig(ctx, d.conf)
	if err != nil {
		return follow.Origin{}, fmt.Errorf("postgres: teardown: connect: %w", err)
	}
	defer closeQuickly(conn)
	return TeardownRelay(ctx, conn, name, tables)
}

// TeardownRelay removes what the relay named name made in the database
// conn reaches for tables (see fanout.Teardown, which calls it through
// [Relayed]): the tables' publications and their rows in cuckooguard_slots
// ([Unpublish], which also drops direct followers' slots) and the relay's
// replication slot. It returns the database's Origin, which names the
// relay's messages and saved guards on the broker.
func TeardownRelay(ctx context.Context, conn Conn, name string, tables []string) (follow.Origin, error) {
	if ctx == nil || noConn(conn) || name == "" {
		return follow.Origin{}, errors.New("postgres: TeardownRelay needs a context, a connection and the relay's name")
	}
	db, err := IdentifyDatabase(ctx, conn)
	if err != nil {
		return follow.Origin{}, err
	}
	for _, t := range tables {
		if err := Unpublish(ctx, conn, t); err != nil {
			return follow.Origin{}, fmt.Errorf("postgres: teardown: %w", err)
		}
	}
	if err := DropRelaySlot(ctx, conn, name); err != nil {
		return follow.Origin{}, fmt.Errorf("postgres: teardown: %w", err)
	}
	return db.Origin(), nil
}

func (d *relayed) Connect(ctx context.Context, table, key string) (follow.Session, error) {
	conn, err := pgx.ConnectConfig(ctx, d.conf)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	em, err := newControlEmitter(ctx, conn, table) // resolves the name, as Resolve
	if err != nil {
		closeQuickly(conn)
		return nil, err
	}
	return &relayedSession{conn: conn, em: em, table: table, key: key}, nil
}

// relayedSession is a relayed follower's connection.
type relayedSession struct {
	conn       *pgx.Conn
	em         *controlEmitter
	table, key string
}

func (s *relayedSession) Origin(ctx context.Context) (follow.Origin, error) {
	db, err := IdentifyDatabase(ctx, s.conn)
	if err != nil {
		return follow.Origin{}, err
	}
	return db.Origin(), nil
}

func (s *relayedSession) Table() string { return s.em.Table() }

func (s *relayedSession) Emit(ctx context.Context, route, payload string) error {
	return s.em.Emit(ctx, s.conn, route, payload)
}

func (s *relayedSession) Read(ctx context.Context, add func(key string) error) (follow.Seen, int64, error) {
	sn, n, err := ReadTable(ctx, s.conn, s.table, s.key, add)
	if err != nil {
		return nil, n, err
	}
	return snapshotSeen{sn}, n, nil
}

func (s *relayedSession) KeyForm(ctx context.Context, prev follow.KeyForm) (follow.KeyForm, error) {
	r, err := resolve(ctx, s.conn, s.table)
	if err != nil {
		return nil, err
	}
	before, _ := prev.(*keyRule)
	rule, err := readKeyRule(ctx, s.conn, r, s.key, s.conn.Config().RuntimeParams, before)
	if err != nil {
		return nil, err
	}
	return rule, nil
}

func (s *relayedSession) Close() { closeQuickly(s.conn) }

// snapshotSeen tells the transactions a read's snapshot saw, by their
// transaction ids.
type snapshotSeen struct{ sn Snapshot }

func (s snapshotSeen) Saw(_ uint64, xid uint32) bool { return s.sn.VisibleXid(xid) }

// ExecIn returns tx as a [follow.Exec], for the Tag of a follower behind
// a relay (fanout.Follower.Tag): the tag is written in tx.
func ExecIn(tx pgx.Tx) follow.Exec {
	return func(ctx context.Context, query string, args ...any) error {
		if tx == nil {
			return errors.New("postgres: ExecIn: tx is nil")
		}
		_, err := tx.Exec(ctx, query, args...)
		return err
	}
}
