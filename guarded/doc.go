// Package guarded puts a [guard.Guard] in front of a store: a [Loader]
// answers [ErrNotFound] for keys the guard knows are absent without asking
// the store, shares one store call among concurrent lookups of a key, and
// keeps the guard in step with the store's writes and, through a change
// feed, with the writes of other processes.
//
//	g, err := guard.New(guard.WithCapacity(1_000_000))
//	...
//	users, err := guarded.New(g, guarded.Funcs[int64, User]{
//		Lookup:   db.Lookup, // SELECT … WHERE id = $1
//		ListKeys: db.IDs,    // SELECT id FROM users: warm-up and rebuilds
//	})
//	...
//	if err := users.Fill(ctx, db.IDs(ctx)); err != nil { ... } // until then, lookups pass through
//	u, err := users.Get(ctx, 42) // ErrNotFound without a query for ids never created
//	err = users.Insert(ctx, 43, func(ctx context.Context) error { return db.Insert(ctx, u) })
//
// The store is a [Getter] (a [GetterFunc], [Funcs], or a type of your own);
// a [BatchGetter] also serves [Loader.GetMany] in one call, and a
// [KeyLister] lets the Loader rebuild its guard. Keys are strings, integers
// or byte arrays, or types that implement [Key].
//
// # Keys: what the guard compares
//
// The guard compares keys exactly, by the bytes it hashes (see [Key]): a
// string by its bytes, an integer by its value, a byte array (a
// uuid.UUID) by its bytes, any other type by what its AppendKey appends.
// It knows nothing of the store's collation or type: "Ada@Example.com" and
// "ada@example.com" are two keys to it even where the store finds one row
// for both (citext, a case-insensitive collation), and so are a UUID in
// upper and lower case when its keys are strings. Give the Loader every
// key in one canonical form, the same on every path: the keys it reads
// (Fill, a rebuild, a change feed), the keys it adds (Insert), and the
// keys it is asked for (Get, and the middleware's KeyFunc, which
// middleware.Parse canonicalizes). Use a key type that has one form where
// there is one (uuid.UUID rather than its text, an integer rather than its
// digits), or lower-case the text of a case-insensitive key everywhere. A
// key asked for in another form than the one added reads absent: a wrong
// 404.
//
// # Copies and removals
//
// The set counts copies, and [guard.Guard.Remove] may only remove a copy the
// guard holds: removing a key that was never added can take the copy of
// another key with the same fingerprint in a shared bucket, which then
// reads absent. The [Loader] keeps this on every path by one rule: each
// creation of a row adds one copy of its key before a reader can see the
// row, and a copy is removed only by a delete known to come after the
// creation whose copy it removes.
//
//   - Warm-up ([Loader.Fill]): the fill adds one copy per row it reads,
//     and [Loader.Insert] one per row it writes (a row both read and
//     written gets two, which is harmless). A Delete that begins before the
//     fill is done removes nothing: the fill may not have read its row yet.
//   - Steady state: Insert adds before its write and takes the copy back
//     only when the store proved it did not commit ([NotWritten]). Delete removes
//     after the store confirmed the delete, from the guard that was
//     complete when the Delete began; rebuilds wait for it.
//   - Rebuild (from a [KeyLister]): the new guard receives every insert from the
//     moment it is installed, and then reads the key source; deletes reach
//     only the old guard, so the new one may keep a deleted key (a false
//     positive), never miss a live one. It also gets one copy of each key
//     whose insert returned with an unknown outcome and that the store has
//     not settled yet ([WithUnsettled]): such a write may commit after the
//     read, and a second copy of a key the read finds is harmless. A feed's
//     Resync and Replace do the same.
//   - Catch-up ([Loader.CatchUp]) over a restored snapshot: the store's
//     changes since the snapshot are applied once each, this process's own
//     deletes included, which therefore remove nothing themselves while the
//     Loader catches up.
//   - Change feed ([Loader.AttachFeed], the postgres follower): Delete
//     removes nothing; the feed applies every delete, this process's own
//     included, in commit order, after the creation it undoes (added by
//     Insert, by an earlier change, or by the feed's snapshot read). The
//     feed skips only this process's own inserts. A key deleted and
//     inserted again through the Loader faster than the feed follows gets
//     a copy per Insert; past [guard.MaxCopies] the guard refuses them, and
//     the Loader owes each refused copy instead of dropping it: a removal
//     takes an owed copy first, so the feed's deletions never take the
//     last copy of a live key. Rebuilds go through the
//     feed's snapshot-aware [Feed.Resync], which the Loader asks for on
//     [Feed.Requests].
//   - Restart from a saved guard ([Feed.Replace]): the feed saved the guard
//     with its position in the stream, and applies every change after that
//     position, in commit order. The inserts an earlier process made are
//     not this process's own, so the feed applies them too: a creation the
//     saved guard lacks is added, and one it holds already gets a second
//     copy (a false positive until the next resync), never none.
//
// # Readiness is checked when the answer is given
//
// A Loader answers "absent" on its own only while it is ready: after
// [Loader.Fill], [Loader.CatchUp] or [Loader.MarkReady], ready until
// [Loader.Invalidate]; with a change feed, ready while the lease of the
// feed's last [Feed.ReadyUntil] holds. A lease is a moment on the
// monotonic clock, granted on evidence (a heartbeat sent through the
// store's change stream at s came back, so the guard holds every change
// committed before s) and compared with the clock by every answer
// "absent" ([Loader.Get], [Loader.GetMany], [Loader.MayContain] and so
// the middleware), and by [Loader.Ready] and [Loader.Stats] (and so
// /readyz and grpc.health), at the moment of the answer. A process that
// was paused wakes with a lapsed lease and passes lookups through until
// its feed hears a heartbeat sent after the pause, however long its
// feed's goroutine takes to run again. Only an answer "absent" reads the
// clock, once (GetMany: once a batch); it costs what reading Go's
// monotonic clock costs (about 20 ns on Linux, through the vDSO).
//
// What the lease assumes of the clock: it is Go's monotonic clock
// (CLOCK_MONOTONIC on Linux), which counts the time a process is stopped
// (SIGSTOP) or starved, a long stop of the world, and a stall of the host
// while the guest's clock runs on. It does not count a system suspend (a
// laptop's sleep), nor the pause of a virtual machine that a hypervisor
// hides from the guest's clock (QEMU's stop and cont keep kvmclock where
// it was, as does a live migration): there the lease goes on from where
// it was, and the feed's next heartbeat (late, so the lease lapses) or
// its silence ends it within the lease's length. Keep leases short: the
// postgres followers grant the max lag (150 ms by default).
//
// # Reading your own writes on every replica
//
// A ready Loader may be up to its feed's lag behind the store: a row
// created on one replica and looked up on another a millisecond later can
// be missing from the second replica's guard. A consistency [Token] names
// a write's place in the store's change stream (package postgres's
// WriteToken: the database and its WAL position after the commit). A
// lookup made under it ([WithToken]) is answered "absent" only once the
// feed has reported a position at or past it ([Feed.Reached], which the
// postgres and fanout followers call for each transaction and heartbeat
// they apply); until then it waits, up to [WithTokenWait], and then asks
// the store. A token of another stream, or one a front could not read
// ([WithUnreadableToken]), asks the store at once. The fronts carry
// tokens for a client: the middleware's Cuckooguard-Token header (and
// cookie), rpcguard's cuckooguard-token metadata, set on the responses of
// writes whose handlers recorded a token ([Wrote], which pgguard's Table
// writes call) and honoured on requests, for the front's own answer and
// the handler's lookups. A lookup without a token pays one atomic load;
// once a process has made a token, its lookups also search their context
// for one.
package guarded
