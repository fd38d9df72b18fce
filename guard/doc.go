// Package guard implements a concurrent approximate set of keys, built from
// independently locked cuckoo filter shards, that answers "definitely
// absent" or "maybe present" without a lock.
//
// A [Guard] sits in front of a slow store. Before asking the store for a
// key, ask the guard: if [Guard.Contains] reports false, the key was never
// added (or was removed) and the store need not be asked.
//
// Package guarded wraps a store lookup with a Guard: definitely-absent keys
// get "not found" without a store call, concurrent lookups of one key share
// one call, and writes keep the guard in step with the store (add before
// the write, remove after a confirmed delete). [Guard.WriteTo] and
// [Restore] save and load snapshots.
//
// # Guarantees
//
//   - No false negatives: a key that was added and not removed is always
//     reported present, by every goroutine, while other keys are being
//     added, removed, evicted or the shard is doubling.
//   - False positives: an absent key is reported present with probability
//     about 2.2e-4 at load 0.9 before any doubling (the estimate of package
//     shard). Growth costs little accuracy: every slot keeps its own tail
//     of position bits, new keys get the longest tail after every
//     doubling, and only older keys give up a bit each time, so after d
//     doublings the rate is about (d+1) times the ungrown one.
//     [Guard.Stats] reports the estimate from the entries' actual tails.
//     The measured rates, with the command that produced them, are in the
//     README's Guarantees section, and only there.
//   - Memory: about 16/α bits per key at load α; a guard filled to the
//     capacity given to [WithCapacity] (≥ 10,000) uses at most 21 bits per
//     key on the heap, all it holds counted ([Stats].Bytes matches the
//     heap; the README's memory section has the figures). Keys with no
//     tail left are copied when their shard doubles (the README counts
//     the copies).
//   - Growth: a shard doubles when its load reaches the grow threshold, as
//     often as needed, until memory or the cap of [WithMaxBytes] runs out
//     (a shard's table can have 2^40 buckets). An add that cannot be placed
//     returns [ErrFull], one past [MaxCopies] copies of a key returns
//     [ErrTooManyCopies]; no add is ever dropped silently.
//   - Shards: a guard keeps the shards it is made with. For a guard that
//     starts small and grows, New makes 4 per core (GOMAXPROCS, at most
//     256) when that fits in 64 KiB or 20 bits per declared key, so that
//     writers and doublings of a grown guard spread over them.
//
// # Memory while growing
//
// The shards of a guard route equal shares of the keys (or, in a small
// mixed layout, shares in proportion to their sizes), so every shard fills
// at the same rate and reaches the grow threshold T at about the same
// moment. Just after that wave of doublings every shard is at load T/2:
// 32/T = 35.6 bits per key at T = 0.9, the worst moment of growth; just
// before it, 16/T = 17.8. The background doublings run on at most
// [WithGrowWorkers] shards at a time, so only a few shards hold both
// tables at once, and the spike that overlapping doublings would make
// does not occur (measured: the worst sample on the heap stays within 2.2
// bits per key of 35.6; TestGrowthCurveWorstSample holds it to 40).
//
// Doubling some shards earlier does not lower that peak: with equal
// shares, a shard's load is fixed by the guard's key count and the
// shard's size, so a shard doubled early sits at half the load of the
// others until they double too. Doubling the fullest shard whenever the
// guard has grown by 2^(1/shards), measured, gave a worst sample of 38.0
// bits per key and a mean of 35.9, against 35.8 and 26.5 without it.
// Shard loads spread between T/2 and T, about 25 bits per key at every
// moment, need routing shares that differ from shard to shard by up to
// 2×, and a guard routed that way is as spread at its declared capacity:
// measured 25.2 bits per key at 1M keys, against 18.5 (BenchmarkGrowthMemory).
// Guards keep equal shares, for the memory at the declared capacity and
// the one-multiply routing of every lookup.
//
// # Removals
//
// The set counts copies, and [Guard.Remove] may only remove a copy the
// guard holds: removing a key that was never added can take the copy of
// another key with the same fingerprint in a shared bucket, which then
// reads absent. Remove only keys you added. Package guarded keeps this
// promise for a store: it adds a key once per creation of a row and
// removes it only after a delete known to follow that creation.
//
// # Hash layout
//
// Every key is hashed once with seeded xxh3 (64 bits); the hash h is then
// cut into disjoint bit ranges, so that the shard, the fingerprint and the
// position of a key are independent:
//
//	bits 63..24  position (40 bits): a shard of 2^k buckets puts the key in
//	             the bucket of its first k bits and keeps up to 7 more in the
//	             slot's tail (see package shard)
//	bits 23..16  fingerprint byte b; the stored fingerprint is max(b, 1) (never 0)
//	bits 15..0   routing value x: shard (x · shards) >> 16 (multiply-shift, so
//	             any shard count works); small guards mix shard sizes and
//	             route by share boundaries instead
//
// [Guard.AddHash], [Guard.ContainsHash] and [Guard.RemoveHash] take h
// directly, for callers that already hash their keys; h must be a
// well-mixed 64-bit hash, and the guard's seed does not apply to it.
//
// # Concurrency
//
// A Guard is safe for concurrent use by multiple goroutines. Lookups take
// no lock and do not allocate. An add whose key finds a free slot in one of
// its two buckets, and a remove that finds its key's entry, take no lock
// either: each is one compare-and-swap of the bucket, counted per core
// (see package shard). An add that must evict entries to make room, and
// the writes to a shard that is doubling or being written to a snapshot,
// lock that shard.
//
// A shard that reaches the grow threshold is queued and doubled in the
// background (package resize), chunk by chunk behind a cursor: lookups
// resolve each of their buckets through the cursor and never wait, and a
// writer of that shard waits for at most one chunk (256 buckets). At most
// [WithGrowWorkers] shards double at the same time. An add that finds no
// room at all doubles the shard itself (or helps finish the doubling in
// progress) rather than fail. [Guard.Close] stops the background work and
// waits for it.
//
// # Usage
//
//	g, err := guard.New(guard.WithCapacity(1_000_000))
//	if err != nil { ... }
//	defer g.Close()
//	if err := g.AddString("user:42"); err != nil { ... } // ErrFull past the memory cap
//	if !g.ContainsString("user:43") {
//		// definitely absent: skip the database
//	}
package guard
