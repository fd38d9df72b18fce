// Package resize decides when the shards of a guard double and runs the
// doublings in the background, with bounded concurrency and a clean stop.
//
// A [Resizer] watches shards that writers hand it through [Resizer.Maybe]:
// a shard whose load factor has reached the threshold (default 0.9) is
// queued, and background workers migrate queued shards chunk by chunk (see
// [shard.Shard.GrowStep]), at most [WithWorkers] at a time. Lookups never
// wait for a migration; a writer of the shard waits for at most one chunk.
// A writer that cannot place a key calls [Resizer.GrowNow], which doubles
// the shard in its own goroutine (or helps finish the doubling in progress)
// so that the key is not lost.
//
// An optional memory cap ([WithMaxBytes]) is checked before every doubling
// allocates its new table; a doubling that would pass it is refused and the
// shard keeps its size, so that a full shard then reports
// [shard.ErrFull].
//
// Package resize knows nothing of keys, hashing, HTTP or stores: it sees
// shards only.
//
// # Goroutines
//
// [New] starts no goroutine. The first shard queued starts a dispatcher
// goroutine, which returns once the queue is empty, so that an idle guard
// holds no goroutine and no stack; each migration runs in a goroutine of
// its own. [Resizer.Close] stops them all and waits for them: a
// migration interrupted by Close stays half done, which is a valid state
// (lookups resolve through the cursor, and the next writer that needs room
// finishes it).
package resize
