// Package postgres publishes a table's key changes from PostgreSQL, so that
// every process's guard can follow the database's own change feed.
//
// [Install] creates a trigger that calls pg_notify on a channel named after
// the table ([Channel]) for every inserted and deleted row and for every
// update that changes the key. A notification is sent when its transaction
// commits, in commit order, and carries the operation, the writing
// transaction's id, a sequence number (so that PostgreSQL does not merge
// two identical notifications of one transaction) and the key, or just
// "resync" when the key is too long for a notification payload.
// [ParseChange] decodes a payload.
//
// A follower LISTENs before it reads the table, so that nothing committed
// in between is missed, and reads the table in a transaction whose
// snapshot ([ReadSnapshot]) tells, for every notification that arrives,
// whether the read already saw its write ([Snapshot.Visible]): those are
// skipped, the others applied in order. This de-duplicates the warm-up
// exactly, without remembering any keys.
//
// [Follower] applies the notifications to a guarded.Loader: it LISTENs,
// reads the table under a snapshot into a fresh guard, applies the changes
// the read did not see, skips this process's own writes (tagged with
// [TagOrigin]; its Loader applied them already), and on a dropped
// connection invalidates the Loader (every lookup passes through),
// reconnects with backoff and resyncs. FOLLOWER.md explains the ordering
// arguments behind it.
package postgres
