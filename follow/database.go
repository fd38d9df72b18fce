package follow

import (
	"context"
	"log/slog"
	"time"
)

// A Database is a database as package fanout relays it: one relay per
// database holds a [Source] of its tables and a [Lease] on its
// leadership, and each relayed follower reaches it through [Session]s for
// its heartbeats and its reads of the table. Each database's package
// returns one (postgres.Relayed, mysql.Relayed).
type Database interface {
	// Source returns the Source of tables for the relay named name
	// (unique among the database's relays, the same across their
	// restarts: it names what the Source holds in the database).
	Source(name string, tables []Table, c SourceConfig) (Source, error)
	// Lease tries to take the lease of the relay named name, for length:
	// nil, nil if another holds it. deadline bounds each call to the
	// database.
	Lease(ctx context.Context, name string, length, deadline time.Duration) (Lease, error)
	// Connect opens a Session for a relayed follower of table, keyed by
	// key, within ctx.
	Connect(ctx context.Context, table, key string) (Session, error)
	// Teardown removes what the relay named name made in the database for
	// tables, and returns the database's Origin.
	Teardown(ctx context.Context, name string, tables []string) (Origin, error)
	// KeyColumn returns where a follower of table reads its key
	// column's form, through connections of its own made within
	// deadline.
	KeyColumn(table, key string, deadline time.Duration) (KeyColumn, error)
	// TagStatement returns the statement that writes a tag of content
	// ([Tagger.Content]) in the writing transaction, with its arguments:
	// the Source passes it on in the transaction's [Commit.Tags].
	TagStatement(content []byte) (query string, args []any)
	// Permanent reports whether err, from a Source's Run, is of a setup
	// that cannot work (a table the database does not stream, a key
	// that cannot be followed), or from KeyColumn's Read, of a key column
	// the guard cannot follow: a relay stops on it, a follower is not made.
	Permanent(err error) bool
}

// SourceConfig is how a relay runs its [Source].
type SourceConfig struct {
	Heartbeat  time.Duration // how often the Source proves its connection
	Deadline   time.Duration // how long the database may take to answer
	Backoff    time.Duration // the wait before the first reconnection
	MaxBackoff time.Duration // the longest wait between reconnections
	Logger     *slog.Logger
}

// A Lease is a relay's right to relay, held in the database until the
// relay stops renewing it (a stopped process, a long pause, a lost
// connection): then another replica takes it. Each lease has a term,
// larger than the term of every earlier holder: the relay stamps its
// messages with it, and followers ignore a relay of an older term once
// they have seen a newer one (fencing).
type Lease interface {
	Term() uint64
	// Renew renews the lease: an error means it is lost, or will be.
	Renew(ctx context.Context, deadline time.Duration) error
	// Held reports whether the lease is surely still held at now, by this
	// process's clock.
	Held(now time.Time) bool
	// Release gives the lease up.
	Release()
}

// A Session is a relayed follower's connection to the database, for one
// table: it identifies the database, sends the follower's markers and
// heartbeats through the database's change stream (the relay passes them
// on after every change committed before them), and reads the table.
type Session interface {
	// Origin identifies the database.
	Origin(ctx context.Context) (Origin, error)
	// Table returns the table's name as the database resolved it (as in
	// [Start.Tables]), resolved when the Session was opened.
	Table() string
	// Emit sends payload through the database's change stream on route
	// ([Control]), with the table's identity as its own transaction sees
	// it.
	Emit(ctx context.Context, route, payload string) error
	// Read reads every key of the table, in the canonical form the Source
	// streams, and returns what the read saw of the transactions the
	// stream carries, and the number of keys.
	Read(ctx context.Context, add func(key string) error) (Seen, int64, error)
	// KeyForm reads the key column's form again; prev is the form read
	// before (or nil), which it may reuse.
	KeyForm(ctx context.Context, prev KeyForm) (KeyForm, error)
	// Close closes the Session, promptly whatever the network does.
	Close()
}

// Seen tells which transactions a [Session.Read] saw.
type Seen interface {
	// Saw reports whether the read saw the transaction committed at pos
	// whose id is xid ([Commit]).
	Saw(pos uint64, xid uint32) bool
}

// Exec runs a statement in the caller's transaction, for a follower's Tag:
// the database's package adapts its driver's transaction to it
// (postgres.ExecIn).
type Exec func(ctx context.Context, query string, args ...any) error
