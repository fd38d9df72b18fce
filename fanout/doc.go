// Package fanout lets many replicas follow a database's tables through one
// reader of its change stream: a [Relay] holds it (for PostgreSQL, one
// replication slot) and publishes every committed change of the guarded
// tables to a NATS JetStream stream, and each replica's [Follower] keeps
// its guarded.Loader in step from the stream.
//
// The package knows no database: it relays any [follow.Database], which
// the database's package returns (postgres.Relayed). The followers do not
// know which database is behind a stream. What follows is said of
// PostgreSQL, the database relayed today.
//
// Following the database directly (postgres.Follower) costs the primary a
// walsender per replica and table, each decoding all of the database's
// WAL: about 30–45 µs of server CPU per change per follower, paid for the
// writes of tables nobody follows too. Behind a relay the database pays
// for one slot and one walsender, whatever the number of replicas and
// tables; JetStream does the fan-out (replication, retention, replay and
// de-duplication), and this package is the two adapters. It is a module
// of its own, so that users of the core library pull in no NATS code.
//
// # What "following" promises
//
// What "following" promises is the direct follower's: every change
// committed before the last heartbeat back has been applied. The
// heartbeats go through the database and come back through the relay and
// the stream, and a Follower judges their lag on its own clock, whether
// messages arrive or not: a relay that is down or hangs, a stream that
// lags, is deleted or purged, and a broker that stalls or restarts all
// make the Loader pass lookups through within the max lag (150 ms by
// default). With the defaults a row committed 300 ms or more before a
// lookup never reads absent on a replica that says it follows.
//
// Continuity is proven, never assumed. A stream deleted and made again is
// another instance; a Follower resumes only in the instance its place is
// in, and only where the stream still holds every message after it. Every
// transaction and every heartbeat the relay passes on names the table's
// last transaction before it in its epoch: a follower that finds a gap (a
// purged or aged-out stream, lost messages), a reset from the relay (its
// slot made anew, the table's publication changed) or a TRUNCATE reads
// the table under a snapshot, and skips the transactions that snapshot
// saw. The relay publishes a transaction only once it is visible to new
// snapshots (a commit waiting for a synchronous standby is held back), so
// a read never misses what the stream already carried. Subjects, messages
// and saved guards carry the database they come from (follow.Origin):
// two databases, and two relays of one table, never share a subject, and
// a message or saved guard of another database is refused.
//
// Every marker and heartbeat also proves which table the stream is of.
// Its own transaction reads the oid that the table's schema-qualified
// name resolves to and the version of that table's publication
// (follow.TableIdentity). The relay passes it on beside the identity of
// the table it streams, and a follower takes it as evidence only when the
// two are equal. A rename swap, a DROP and CREATE, or a table taken out
// of its publication end "following" at the first heartbeat after them,
// and the relay looks again at once. Once the name's table is published,
// the relay streams it and resets it, and the followers read it.
//
// The relay's right to relay is a lease in PostgreSQL, renewed every
// relay heartbeat: a relay that hangs (a stopped process, a long pause)
// loses it within about three heartbeats, another replica takes it and the
// slot, and what the old relay publishes when it wakes is ignored by its
// term (fencing). A database restored to an earlier point (a
// point-in-time restore, a copy of its data directory put back) takes its
// transaction ids and LSNs back with it, and with them the terms: a relay
// that finds in the stream a term above its own, or an LSN past the WAL's
// end, while it holds its lease, resets the table as "rewound", and the
// followers take that reset whatever its term, read the table again and
// follow the new relay's terms. A restore that the database outgrew
// before its relay looked (more transactions and WAL since the restore
// than were lost) is not recognised: the followers fence the new relay
// and pass lookups through (no wrong 404s, and no following) until a relay
// takes its lease with a transaction id above the lost terms. A new
// replica starts from the newest guard saved in the
// JetStream object store with the place in the stream it reflects
// ([WithSnapshots]), and reads nothing from the table.
//
// Every replica of a service runs both, with the same relay name:
//
//	nc, err := nats.Connect(natsURL)
//	db, err := postgres.Relayed(dsn) // the database behind the stream
//	relay, err := fanout.NewRelay(db, "users-api", nc, []follow.Table{{Table: "users", Key: "id"}})
//	go relay.Run(ctx) // one replica relays at a time; another takes over when it dies or hangs
//	f, err := fanout.NewFollower(users, nc, db, "users", "id", parseID,
//		fanout.WithRelay("users-api"),
//		fanout.WithOrigin(replicaID),
//		fanout.WithSnapshots(fanout.DefaultBucket, time.Minute, relay.Leading))
//	go f.Run(ctx)
//	// This replica's inserts name their keys, as with postgres.Follower.Tag:
//	err = users.Insert(ctx, id, func(ctx context.Context) error {
//		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//			if err := f.Tag(ctx, postgres.ExecIn(tx), id); err != nil {
//				return err
//			}
//			_, err := tx.Exec(ctx, `INSERT INTO users (id, name) VALUES ($1, $2)`, id, name)
//			return err
//		})
//	})
package fanout
