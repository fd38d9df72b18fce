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
