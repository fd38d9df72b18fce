package postgres

import "errors"

// errResync ends a session when a notification asks for a resync.
var errResync = errors.New("postgres: resync requested")

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

// Reason says why a session of a Follower ended in an error: the value of
// [FollowerStats.LastErrorReason], the key of
// [FollowerStats.FailuresByReason], and the "reason" of the Follower's log
// lines ([WithLogger]). The set is fixed: see [Reasons].
type Reason string

// The reasons a session fails.
const (
	ReasonConnect         Reason = "connect"          // connecting failed or took longer than the heartbeat deadline
	ReasonListen          Reason = "listen"           // LISTEN failed
	ReasonNotInstalled    Reason = "not_installed"    // no trigger of Install on the table: ErrNotInstalled
	ReasonResync          Reason = "resync"           // reading the table failed
	ReasonNoNotifications Reason = "no_notifications" // the connection answers but delivers no notifications: ErrNoNotifications
	ReasonConnectionLost  Reason = "connection_lost"  // a connection broke, or stopped answering
	ReasonHeartbeatLost   Reason = "heartbeat_lost"   // nothing came back within the deadline while a heartbeat was out
	ReasonNotification    Reason = "notification"     // a notification could not be decoded or applied
)

// Reasons lists every [Reason], for metrics that export one series each.
var Reasons = []Reason{ReasonConnect, ReasonListen, ReasonNotInstalled, ReasonResync,
	ReasonNoNotifications, ReasonConnectionLost, ReasonHeartbeatLost, ReasonNotification}

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
