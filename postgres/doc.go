// Package postgres keeps every process's guard in step with a PostgreSQL
// table, from the database's own change stream.
//
// A [Follower] per process applies the table's changes to its
// guarded.Loader. By default it reads them through logical decoding:
// [Publish] creates a publication of the table's key column alone
// (PostgreSQL 15 or later, wal_level = logical), so that the server decodes
// and sends nothing else, and adds no trigger: the table's writers pay only
// the WAL they write anyway. Each process streams from a replication slot
// of its own, named after the table and its origin ([WithOrigin]). The
// slot keeps the changes since the process's position, so a lost
// connection resumes where it stopped, and a restarted process starts from
// the guard it saved with its position ([WithSnapshotFile]) instead of
// reading the table.
//
// The first read of the table runs under the snapshot that the slot
// exports as it is made, so the read and the stream meet exactly: the read
// sees the transactions that committed before the slot's consistent point,
// the stream carries the others, in commit order. Inserts, deletes, key
// updates and TRUNCATE are applied at their transaction's commit, except
// the inserts of the keys this process's transactions named
// ([Follower.Tag]), which its Loader added before writing them. A session
// cut inside a transaction applies none of it; the next one replays it
// whole. The heartbeat, a transactional logical decoding message the
// Follower sends itself, comes back in commit order behind every change
// committed before it: it measures the lag, finds a connection that is
// dead without saying so, and carries the version of the publication, so
// that a publication changed under the Follower (a row filter, an
// operation left out, the table dropped from it) ends "following" before
// the hole it leaves can be served.
//
// Keys reach the Loader in the canonical form of the key column's type:
// two texts the database takes for one key (the padding of a
// character(n), the case of a citext, the scale of a numeric, the time
// zone of a timestamptz) are one key to the guard, on every path: the
// read, the stream, the snapshot file, the Loader's own tagged inserts,
// and the lookups, through [Follower.Key]. A key column whose equality
// the guard cannot hold (a nondeterministic collation, say) is refused
// with [ErrKeyType]. The README's "Key types" lists each type.
//
// A table keyed by several columns, such as a multi-tenant table's
// (tenant_id, id), is followed as one key of all of them: name them with
// [Columns] wherever a key column is taken. Each column keeps its own
// type's equality and canonical form, and the guard holds a key as its
// [Tuple], each column's text prefixed with its length, so that two keys
// are one text exactly when the database holds them equal, column by
// column, and the same id under another tenant is another key. The key
// columns must be all of the table's replica identity. Lookups name
// every column: a Tuple ([TupleOf]), or a key type of the caller's that
// reads and writes one.
//
// [WithNotify] follows through a trigger and LISTEN/NOTIFY instead
// ([Install] creates the trigger; [Follower.Tag] names the keys), for servers
// without logical decoding. It costs the table's writers: a transaction
// with a pending notification takes an instance-wide lock at commit. It
// reads the whole table after every lost connection, under a snapshot
// ([ReadSnapshot], [Snapshot.Visible]) that tells which notifications the
// read saw.
//
// Replication slots are a server resource: a permanent slot of a process
// that never returns holds WAL until it is dropped. [Slots] lists the
// table's slots with the WAL each holds, [DropStaleSlots] drops those not
// used for a while, and the server's max_slot_wal_keep_size bounds what
// any slot can hold (the README gives the sizing). FOLLOWER.md explains
// the ordering arguments behind all of it.
//
// Every replica of a service runs the same few lines (ExampleFollower is
// the whole program):
//
//	if err := postgres.Publish(ctx, conn, "users", "id"); err != nil { ... } // safe from every replica at once
//	loader, err := guarded.New(g, store)                                   // the Loader your handlers use
//	...
//	f, err := postgres.NewFollower(loader, dsn, "users", "id", parseID,
//		postgres.WithOrigin(replicaID),                   // stable across restarts, unique among the replicas
//		postgres.WithSnapshotFile("/var/lib/app/users.guard"), // optional: restart without reading the table
//		postgres.WithLogger(logger))
//	...
//	go func() {
//		// Until ctx ends; returns early only for a setup that cannot work
//		// (ErrLogicalUnavailable, ErrNotPublished).
//		if err := f.Run(ctx); err != nil && ctx.Err() == nil {
//			logger.Error("follower", "error", err)
//		}
//	}()
//	// The replica's own inserts go through the Loader, and name the key:
//	err = loader.Insert(ctx, id, func(ctx context.Context) error {
//		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//			if err := f.Tag(ctx, tx, id); err != nil {
//				return err
//			}
//			_, err := tx.Exec(ctx, `INSERT INTO users (id, name) VALUES ($1, $2)`, id, name)
//			return err
//		})
//	})
package postgres
