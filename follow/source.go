package follow

import "context"

// Table is a table that a [Source] streams, and its key: the name and
// key column (or columns, as the database's package spells several) that
// the database's followers take.
type Table struct {
	Table string
	Key   string
}

// A Source streams the committed changes of several tables in commit
// order, for a relay that passes them on. It keeps no guard: it is a
// pipe. It holds its place in the database's history (a replication slot,
// a binlog position) from the position its handler last confirmed
// ([Source.Confirm]), so that a relay that confirms only what its readers
// can read durably loses nothing across a lost connection or a restart,
// even on another process.
//
// The handler gets a commit that changed a table only once it is visible
// to new snapshots: a reader that learns of a commit from the handler's
// output and then reads the table ([Session.Read]) sees its rows.
type Source interface {
	// Run streams until ctx ends or a session fails, calling h from its
	// own goroutine: Start once per session, then Commit per transaction.
	// It returns ctx's cause when ctx ends, and an error for which the
	// Database's Permanent reports true when the setup cannot work.
	Run(ctx context.Context, h Handler) error
	// Confirm says that everything up to pos is durably passed on: the
	// Source may let the database forget it.
	Confirm(pos uint64)
	// Recheck asks for a heartbeat through the database now.
	Recheck()
	// Stats describes the Source.
	Stats() SourceStats
}

// SourceStats describes a [Source].
type SourceStats struct {
	Streaming bool   // a session streams now
	Sessions  int64  // sessions started
	Failures  int64  // sessions that ended in an error
	Commits   int64  // commits passed to the handler
	Confirmed uint64 // the position the handler confirmed
	LastError error  // of the last failed session
	// VisibilityWaits counts the snapshots the Source asked for because a
	// decoded commit was not visible to the last one yet.
	VisibilityWaits int64
	// Retained is what the database holds back for the Source, in bytes
	// (the WAL a PostgreSQL slot holds), as of the last heartbeat.
	Retained int64
}

// A Handler takes what a [Source] streams, from Run's goroutine, in
// commit order.
type Handler interface {
	// Start is called when a session's stream starts, before its first
	// commit.
	Start(ctx context.Context, s Start) error
	// Commit is called for each committed transaction that changed a
	// table or carries control messages. Its slices are reused after it
	// returns.
	Commit(ctx context.Context, c *Commit) error
}

// Start is where a Source's stream starts, for [Handler.Start].
type Start struct {
	Pos uint64 // the stream carries the transactions that commit after it
	// Reset: the Source's place in the history was made anew (it did not
	// exist, or the database lost what it needed), so transactions that
	// committed between the end of what an earlier stream carried and Pos
	// are in no stream: the relay's readers must read the tables again.
	Reset bool
	// Tables are the tables as the database resolved their names (for
	// PostgreSQL "schema.table"), and Versions the version of what
	// decides which of each one's changes the stream carries (its
	// publication's), in the order of the Source's tables. A stream of
	// another version than an earlier stream carried a table's changes
	// under may have left changes out of that stream: the relay's readers
	// of that table must read it again.
	Tables, Versions []string
	// Origin is the database the stream comes from.
	Origin Origin
	// Identities are the identities of the tables the stream carries, in
	// the order of the Source's tables. A relayed follower's control
	// message that saw another ([Control.Table]) was sent while the name
	// named another table: the stream is not of the table the
	// application queries.
	Identities []TableIdentity
	// End is the end of the database's history when the session began. A
	// stream that carried a later position than End, of this Origin, comes
	// from a history the database no longer has: it was restored to an
	// earlier point.
	End uint64
}

// Commit is one committed transaction, for [Handler.Commit].
type Commit struct {
	Pos      uint64    // its place in the history: the end of its commit record
	Token    uint64    // its place in the stream of writers' tokens (Origin.TokenStream), where that is not Pos; 0: none
	Xid      uint32    // its transaction id, if the database has one that reads can see ([Seen])
	Tables   []Changes // what it did to each table, in the order of the Source's tables
	Tags     [][]byte  // its tags (a follower's Tag), as written
	Controls []Control // markers and heartbeats of relayed followers
}

// Changes is what a transaction did to one table: its keys in the
// canonical form of the key column's type, as [Session.Read] reads them.
type Changes struct {
	Creates, Deletes []string
	Truncated        bool
	// Incomplete: the transaction changed more keys than a Source holds
	// back, and some of this table's are missing: its readers must read
	// the table again, as after a TRUNCATE.
	Incomplete bool
}

// Touched reports whether the transaction changed the table.
func (c *Changes) Touched() bool {
	return len(c.Creates) > 0 || len(c.Deletes) > 0 || c.Truncated || c.Incomplete
}

// Control is a marker or heartbeat that a relayed follower sent through
// the database ([Session.Emit]) on Route.
type Control struct {
	Route, Payload string
	// Table is the identity of the follower's table as the message's own
	// transaction saw it; zero if the follower sent none.
	Table TableIdentity
}
