// Package shard implements one (2,4)-cuckoo filter table with lock-free
// lookups and in-place doubling without a size limit, the building block
// of package guard.
//
// A Shard stores 16-bit slots, four to a bucket, one bucket per uint64, in a
// table of 2^k buckets. It knows nothing about keys or how they are hashed:
// callers pass an 8-bit fingerprint f (never 0) and a position v, of which
// the top [VirtualBits] bits are used. Package guard derives both from one
// 64-bit hash of the key.
//
// # Slot layout
//
// An item has two candidate positions, V1 = v and V2 = V1 XOR G(f), with
// G(f) = fmix64(f) over the position bits and its first bit set. In a table
// of 2^k buckets an item at position Vc lives in bucket Vc>>(64-k), the
// first k bits of Vc; its slot keeps f and a tail of the next t bits of Vc,
// 0 ≤ t ≤ [MaxTailBits], closed by a 1 (the terminator):
//
//	f (8 bits) | tail (t bits) | 1 | 0 … 0 (7-t bits)
//
// Every entry thus carries its own tail length. An entry inserted into a
// table of 2^k buckets gets the longest tail, min(7, VirtualBits-k). A
// lookup compares each lane with the item's probe: equal fingerprints and
// equal bits above the lane's terminator, for all four lanes at once with
// no branch (see matches). An entry with an empty tail (void) matches every
// item with its fingerprint and bucket.
//
// # Doubling
//
// A doubling (2^k → 2^(k+1) buckets) splits bucket j into buckets 2j and
// 2j+1 by the first bit of each entry's tail, which the entry gives up.
// Both children are fed by one bucket, so a split never overflows and
// runs chunk by chunk without evictions. Because G covers every position
// bit, an entry's alternate stays its alternate at every size. A void
// entry no longer knows which child its items fall into: it is copied into
// both (as in the Aleph filter), which costs a few slots and keeps every
// item found. A shard can double until its table has 2^VirtualBits
// buckets.
//
// A shard doubles when told to ([Shard.Grow]), or by itself under a
// growth policy ([Growth], attached with [Shard.SetGrowth]), which owns
// every growth decision for the shards that share it: the load at which a
// shard should double ([Shard.NeedsGrowth], [Shard.GrowStep], which
// package resize runs in the background), the memory cap that each
// doubling reserves its table from, and the refusal to double for a crowd
// of colliding items. An insert under a policy that finds no room doubles
// the shard itself before it gives up with [ErrFull].
//
// A shard doubles its whole table, and holds both tables until the split
// ends. Linear hashing, which splits one bucket at a time so that the
// table grows by a bucket and memory stays flat, was built and measured
// (issue 23, branch wip/issue-23-linear-growth at a889135, not kept) and
// not taken. It reached 21.3–23.6 bits per key at every moment of growth,
// against up to 35.6 with whole-table doubling, but a lookup had to
// resolve each bucket through the split pointer, which made ungrown
// lookups 14–25% slower, and adds cost 307 ns per key at a split load of
// 0.8 and 384 ns at 0.85 (21.8 bits per key), against 146 ns: an unsplit
// bucket takes twice the inflow of a split one, so the table runs unevenly
// full, and inserts at load 0.85–0.93 cost 208–572 ns in this table. The
// lookup is the path every request takes, so the slot format and the
// lookup stayed as they are. Staggering the shards' doublings instead
// (issue 35) needs shards whose routing shares differ; package guard's
// documentation, "Memory while growing", has the figures.
//
// # Guarantees
//
//   - No false negatives: an item inserted and not deleted is always reported
//     present, including while other items are being evicted (kicked) and
//     across doublings.
//   - An insert that cannot be placed returns [ErrFull] and leaves every item
//     stored before it exactly where it was; nothing is dropped. More than
//     [MaxCopies] identical copies of one item are refused with
//     [ErrTooManyCopies].
//   - False positives: an entry with a t-bit tail matches an absent item
//     that probes its bucket with probability about 2^-t/255. In a table
//     that doubles whenever it reaches load α, each generation of entries
//     (those inserted between two doublings) contributes the same share, so
//     after d doublings the rate is about (d+1)·8α/(255·256): 2.2e-4 at
//     α = 0.9 before any doubling. [Shard.Stats] reports the estimate from
//     the entries' actual tail lengths. The measured rates, with the
//     command that produced them, are in the README's Guarantees section.
//
// # Deletes
//
// Delete removes, of the entries an item matches in its two buckets and the
// stash, one with the longest tail. If that entry belongs to another item,
// the deleted item's own entry, whose tail is a prefix of it, is left and
// matches every item the removed one matched: no false negative. The
// copies of a void entry in buckets the item never probes are left behind;
// they can only cause false positives. Deleting an item that was never
// inserted can remove another item's entry; callers delete only what they
// inserted.
//
// # Concurrency
//
// The common writes take no lock: an insert that finds a free slot in one
// of its two buckets, and a delete that finds its entry, are one
// compare-and-swap of the bucket, counted on per-P counter stripes (see
// counter.go). Evictions, the stash, doublings and encodings serialize on
// the shard's mutex; a doubling and an encoding close a gate that keeps
// lock-free writers out until they end, and evictions run beside them,
// writing with compare-and-swap and giving up a path that a lock-free
// delete changed. Lookups take no lock: buckets are read with atomic loads, and
// version counters striped by bucket (seqlock.go) are odd while entries
// move between the buckets they guard. An insert that must evict finds its
// whole path first, moving nothing, then moves the entries from the free
// end back, so lookups see a window of a few stores on the stripes of the
// path's buckets only. A lookup that finds its item returns at once; a
// miss is trusted only if the stripe of its first bucket was even and
// unchanged across the reads (the memory-ordering argument is in
// seqlock.go), otherwise the lookup retries. A plain insert into a free
// slot and a delete move nothing, so they bump nothing.
//
// # Usage
//
//	s, err := shard.New(10) // 2^10 buckets, 4096 slots
//	if err != nil { ... }
//	_ = s.Insert(f, v)      // f != 0; ErrFull if it cannot be placed
//	if s.Contains(f, v) { ... } // maybe present
//	s.Delete(f, v)          // removes one copy
package shard
