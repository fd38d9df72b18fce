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
//
// Every replica of a service runs the same few lines (ExampleFollower is
// the whole program):
//
//	if err := postgres.Install(ctx, conn, "users", "id"); err != nil { ... } // safe from every replica at once
//	loader, err := guarded.New(g, store)                                   // the Loader your handlers use
//	...
//	f, err := postgres.NewFollower(loader, dsn, "users", "id", parseID,
//		postgres.WithOrigin(replicaID), postgres.WithLogger(logger))
//	...
//	go func() {
//		// Until ctx ends; returns early only for a setup that cannot work
//		// (ErrNotInstalled, ErrNoNotifications).
//		if err := f.Run(ctx); err != nil && ctx.Err() == nil {
//			logger.Error("follower", "error", err)
//		}
//	}()
//	// The replica's own inserts go through the Loader and carry its origin:
//	err = loader.Insert(ctx, id, func(ctx context.Context) error {
//		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//			if err := postgres.TagOrigin(ctx, tx, replicaID); err != nil {
//				return err
//			}
//			_, err := tx.Exec(ctx, `INSERT INTO users (id, name) VALUES ($1, $2)`, id, name)
//			return err
//		})
//	})
package postgres
