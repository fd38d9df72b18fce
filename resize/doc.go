// Package resize runs the doublings of a guard's shards in the background,
// with bounded concurrency and a clean stop.
//
// Whether and how far a shard grows is its growth policy's to decide
// ([shard.Growth]: the load threshold, the memory cap, the refusal of a
// crowd); a [Resizer] only decides which goroutine does the work, and
// when. Writers hand it a shard through [Resizer.Maybe] after each insert;
// a shard that needs growth ([shard.Shard.NeedsGrowth]) is queued, and
// background workers double queued shards chunk by chunk
// ([shard.Shard.GrowStep]), at most [WithWorkers] at a time. Lookups never
// wait for a migration; a writer of the shard waits for at most one chunk.
// A writer that finds no room does not wait for the workers: its insert
// doubles the shard in its own goroutine, or helps finish the doubling in
// progress (see [shard.Shard.Insert]).
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
