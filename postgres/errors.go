package postgres

import (
	"errors"

	"github.com/cuckooguard/cuckooguard/follow"
)

// errResync ends a session when a notification asks for a resync.
var errResync = errors.New("postgres: resync requested")

// errPublicationChanged ends a session whose marker or heartbeat says that
// the publication changed since the session began: the next one reads
// the table.
var errPublicationChanged = errors.New("postgres: the publication changed")

// errTableChanged ends a session whose marker or heartbeat says that the
// table's name no longer resolves to the table the session follows (a
// rename swap, a DROP and CREATE): the next one resolves the name again
// and reads the table it names.
var errTableChanged = errors.New("postgres: the table's name resolves to another table")

// errSlotMoved ends a session whose stream the server started past the
// position the follower asked for (the slot had moved, or was made again,
// since it was read): the next one reads the table.
var errSlotMoved = errors.New("postgres: the slot had moved past the follower's position")

// ErrPayload is returned by ParseChange for a payload it cannot decode.
var ErrPayload = errors.New("postgres: malformed notification payload")

// ErrNotInstalled is returned by [Follower.Run] when the table has no
// enabled trigger of [Install] that publishes on the Follower's channel:
// the Follower would hear nothing but its own heartbeats. Run Install
// (with the same table name as the Follower's), or enable the trigger.
var ErrNotInstalled = errors.New("postgres: no cuckooguard trigger publishes the table's changes on the follower's channel (run postgres.Install with the same table name)")

// ErrNoNotifications is returned by [Follower.Run] when its first session
// gets nothing back on its LISTEN connection, not even the marker it sent
// itself through the database: the connection cannot LISTEN (a PgBouncer
// in transaction pooling mode accepts LISTEN and delivers nothing). Point
// the Follower at the database itself, or at a session-pooling bouncer.
var ErrNoNotifications = errors.New("postgres: follower: no notifications arrive on the LISTEN connection")

// ErrNotPublished is returned by [Follower.Run] when the table has no
// publication of [Publish] with its key column: logical decoding would
// send nothing. Run Publish (with the same table and key column).
var ErrNotPublished = errors.New("postgres: the table is not published for the follower (run postgres.Publish with the same table and key column)")

// ErrLogicalUnavailable is returned by [Publish] and [Follower.Run] when
// the server cannot stream the table's changes to the follower. The error
// wrapping it says which prerequisite is missing: wal_level = logical,
// PostgreSQL 15 or later (publications with a column list), the
// REPLICATION attribute of the user, or a replica identity that lets a
// delete of the key be decoded. [WithNotify] follows a table without
// logical decoding, at a cost to its writers.
var ErrLogicalUnavailable = errors.New("postgres: logical decoding is not available for the follower")

// ReadReason says why a Follower read the whole table instead of resuming
// from a position: the key of [FollowerStats.FullReads] and of the reason
// label of the follower's full-read metric. The set is fixed: see
// [ReadReasons].
type ReadReason string

// The reasons for a full read.
const (
	ReadStart          ReadReason = "start"               // the first session, without a snapshot file
	ReadNoSnapshot     ReadReason = "snapshot_missing"    // the snapshot file does not exist yet
	ReadBadSnapshot    ReadReason = "snapshot_bad"        // the snapshot file could not be read, or is of another table or slot
	ReadStaleSnapshot  ReadReason = "snapshot_stale"      // the slot has moved past the snapshot's position
	ReadSlotMissing    ReadReason = "slot_missing"        // the replication slot is gone
	ReadSlotLost       ReadReason = "slot_lost"           // the server removed WAL the slot needed (max_slot_wal_keep_size)
	ReadRequested      ReadReason = "requested"           // the Loader asked for a fresh guard (a full shard, too high a false-positive rate)
	ReadTruncated      ReadReason = "truncated"           // the table was truncated
	ReadBigTransaction ReadReason = "big_transaction"     // a transaction deleted more keys than a session holds back (maxTxKeys)
	ReadNoResume       ReadReason = "no_resume"           // a lost connection, without a permanent slot (no origin) or with NOTIFY
	ReadResumeFailed   ReadReason = "resume_failed"       // the stream could not be resumed from the last position
	ReadSlotMoved      ReadReason = "slot_moved"          // the slot had moved past the position (made again, or moved by another process)
	ReadPublication    ReadReason = "publication_changed" // the publication changed since the guard's changes were decoded
	ReadTableChanged   ReadReason = "table_changed"       // the table's name resolved to another table (a rename swap, a DROP and CREATE)
	ReadRewound        ReadReason = "rewound"             // the server's WAL ends before the guard's position: the database was restored to an earlier point
)

// ReadReasons lists every [ReadReason].
var ReadReasons = []ReadReason{ReadStart, ReadNoSnapshot, ReadBadSnapshot, ReadStaleSnapshot,
	ReadSlotMissing, ReadSlotLost, ReadRequested, ReadTruncated, ReadBigTransaction, ReadNoResume, ReadResumeFailed,
	ReadSlotMoved, ReadPublication, ReadTableChanged, ReadRewound}

// Reason says why a session of a Follower ended in an error: the value of
// [FollowerStats.LastErrorReason], the key of
// [FollowerStats.FailuresByReason], and the "reason" of the Follower's log
// lines ([WithLogger]). The set is fixed: see [Reasons].
type Reason string

// The reasons a session fails.
const (
	ReasonConnect         Reason = "connect"          // connecting failed or took longer than the heartbeat deadline
	ReasonListen          Reason = "listen"           // LISTEN, or starting the replication stream, failed
	ReasonNotInstalled    Reason = "not_installed"    // no trigger of Install on the table: ErrNotInstalled
	ReasonResync          Reason = "resync"           // reading the table failed
	ReasonNoNotifications Reason = "no_notifications" // the connection answers but delivers no notifications: ErrNoNotifications
	ReasonConnectionLost  Reason = "connection_lost"  // a connection broke, or stopped answering
	ReasonHeartbeatLost   Reason = "heartbeat_lost"   // nothing came back within the deadline while a heartbeat was out, and the walsender was not at work (a silent connection)
	ReasonNotification    Reason = "notification"     // a change could not be decoded or applied
	ReasonSetup           Reason = "setup"            // logical decoding is not available, or the table not published: ErrLogicalUnavailable, ErrNotPublished
	ReasonSlot            Reason = "slot"             // the replication slot could not be made, read or used (say, another process streams from it)
	ReasonPublication     Reason = "publication"      // the publication changed while the session followed: the next one reads the table
	ReasonTerminated      Reason = "terminated"       // the server ended the connection (SQLSTATE 57: pg_terminate_backend, a shutdown or restart)
	ReasonTableChanged    Reason = "table_changed"    // the table's name resolved to another table while the session followed: the next one reads the table it names
)

// Reasons lists every [Reason], for metrics that export one series each.
var Reasons = []Reason{ReasonConnect, ReasonListen, ReasonNotInstalled, ReasonResync,
	ReasonNoNotifications, ReasonConnectionLost, ReasonHeartbeatLost, ReasonNotification,
	ReasonSetup, ReasonSlot, ReasonPublication, ReasonTerminated, ReasonTableChanged}

// sessionError is why a session ended.
type sessionError struct {
	reason Reason
	err    error
}

func (e *sessionError) Error() string { return e.err.Error() }
func (e *sessionError) Unwrap() error { return e.err }

// failed tags err with the reason the session ended.
func failed(r Reason, err error) error {
	return &sessionError{reason: r, err: err}
}

// reasonOf returns the reason err was tagged with.
func reasonOf(err error) Reason {
	var se *sessionError
	if errors.As(err, &se) {
		return se.reason
	}
	return ReasonConnectionLost // not tagged: a connection's error
}

// ErrKeyNotIdentity is returned by [Publish] and [Follower.Run] when the
// follower's key column is not the table's replica identity (its primary
// key, or REPLICA IDENTITY USING INDEX of a unique index on the column): a
// delete sends only the replica identity's columns, so the follower could
// not tell which key it removed. Follow the table by its primary key, or
// make a unique index of the key column its replica identity.
var ErrKeyNotIdentity = errors.New("postgres: the follower's key column is not the table's replica identity")

// ErrKeyType is returned by [Publish], [NewFollower], [newSource],
// [ReadTable] and the Run of a Follower or Source when the key column's
// type has an equality the guard cannot hold: two texts that the database
// takes for one key would be two keys to the guard, and a lookup in the
// other form would read absent although the database finds the row. The
// error wrapping it names the type, its collation where that is the
// cause, and what to do. The README's "Key types" lists the types and
// what the follower does with each.
var ErrKeyType = errors.New("postgres: the key column's type cannot be followed")

// ErrKeyUnknown is returned by [Follower.Key] (and [Tagger.Key]) before
// the follower has read its key column's type: NewFollower could not
// reach the database, and no session has started since. Pass the lookup
// on to the store.
var ErrKeyUnknown = follow.ErrKeyUnknown
