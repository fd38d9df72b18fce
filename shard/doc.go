// Package shard implements one (2,4)-cuckoo filter table with lock-free
// lookups and in-place doubling, the building block of package guard.
//
// A Shard stores 16-bit slots, four to a bucket, one bucket per uint64, in a
// table of 2^k buckets. It knows nothing about keys or how they are hashed:
// callers pass an 8-bit fingerprint f (never 0) and a virtual index v, of
// which the low [VirtualBits] bits are used. Package guard derives both from
// one 64-bit hash of the key.
//
// # Slot layout ("scheme C")
//
// The shard currently has T tail bits (T starts at [InitialTailBits]; F + T =
// 16 with F = [FingerprintBits]). Each item has two candidate virtual indexes,
// V1 = v and V2 = V1 XOR G(f) with G(f) = fmix64(f) | 1, both taken modulo
// 2^(k+T). A slot in bucket j = Vc mod 2^k holds f<<T | (Vc>>k mod 2^T), where
// Vc is the candidate the slot occupies. A lookup computes the expected 16-bit
// value for each of its two buckets and matches it exactly, so the tail bits
// count as fingerprint bits. Because k+T never changes, the XOR relation
// between the two candidates survives every doubling.
//
// # Guarantees
//
//   - No false negatives: an item inserted and not deleted is always reported
//     present, including while other items are being evicted (kicked) and
//     across [Shard.Grow].
//   - An insert that cannot be placed returns [ErrFull] and leaves every item
//     stored before it exactly where it was; nothing is dropped.
//   - The false-positive rate at load factor α with T tail bits is about
//     8·α/2^(8+T): 1.1e-4 at α = 0.9 before any doubling. Each doubling
//     removes one tail bit, so it doubles the rate.
//   - A shard can double T0 = 8 times (256× its initial size); after that
//     [Shard.Grow] returns [ErrSaturated].
//
// # Concurrency
//
// Writers (Insert, Delete, Grow) serialize on the shard's mutex. Lookups take
// no lock: buckets are read with atomic loads, and a per-shard sequence
// counter (a seqlock) is odd while fingerprints move (an eviction chain, a
// stash move, a table swap). A lookup that finds its item returns at once; a
// miss is trusted only if the sequence was even and unchanged across the
// reads, otherwise the lookup retries. A plain insert into a free slot and a
// delete do not move other items, so they need no sequence bump.
//
// # Usage
//
//	s, err := shard.New(10) // 2^10 buckets, 4096 slots
//	if err != nil { ... }
//	_ = s.Insert(f, v)      // f != 0; ErrFull if it cannot be placed
//	if s.Contains(f, v) { ... } // maybe present
//	s.Delete(f, v)          // removes one copy
package shard
