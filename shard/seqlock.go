package shard

import "sync/atomic"

// Lookups take no lock. They validate a miss against version counters,
// striped by bucket as in MemC3: stripe(b) guards bucket b (and the stash
// entries filed under b). A writer makes the stripes of the buckets an
// entry leaves and enters odd for the move, then even again; a lookup
// reads the stripe of its first bucket, its two buckets, and the stripe
// again, and trusts a miss only if the stripe was even and unchanged.
// Everything is a sync/atomic operation, so all of it is sequentially
// consistent:
//
//   - An item's entry lives in one of the item's two buckets (or the stash,
//     filed under one of them), so the only moves that can hide it from a
//     lookup are moves between those two buckets, and every such move
//     bumps both buckets' stripes, the first one's included: one stripe
//     is enough to validate.
//   - A move of entry e from bucket p to bucket q stores e into q, then
//     clears it from p (copy before clear: e is never in neither bucket),
//     between two increments of stripe(p) and stripe(q). A lookup that
//     read q before the copy and p after the clear read its stripe before
//     the first increment and again after it (its reads of the buckets lie
//     in between), so it sees the stripe odd or changed and retries.
//   - A lookup whose stripe did not change read its buckets either before
//     or after every move between them, never during one, so the entry it
//     looks for was in one of them when it read it.
//   - A plain insert into a free slot and a delete move nothing and bump
//     nothing: a lookup that misses an insert that overlapped it, or
//     finds an entry being deleted, was allowed to. That holds for the
//     lock-free ones too (counter.go): each is one compare-and-swap of one
//     bucket, and an eviction path that one of them changes is given up
//     only after each of its moves completed (see movePathLocked).
//   - An eviction path is found first without moving anything (see
//     kickLocked), then moved from its end toward its start, one entry at
//     a time: each move opens a window of two stores on two stripes, not
//     one on the whole shard for a whole random walk, as a walk that
//     moves as it searches would need.
//   - A doubling's splits move nothing in the table lookups resolve to
//     (the old table keeps every slot it splits; the new one gets its
//     buckets before the cursor passes them); the stash entries it moves
//     at the end are moves under every stripe.
//
// Stripes are indexed by the bucket's number in the shard's current
// table. A lookup still reading an older table reads a frozen copy (no
// writer moves anything in it), so a stripe that a move in the new table
// bumped costs it at most a spurious retry.

// stripes is the number of version counters of a shard. They share the
// cache line that lookups read anyway (the table pointer's), so they cost
// no memory and no extra miss; a move makes a lookup retry only if one of
// the lookup's two stripes is one of the move's. They are 64 bits wide,
// so that no count of moves between a lookup's two reads can wrap around
// to the value it read first.
const stripes = 7

// stripeOf returns the stripe of bucket b: its last three bits, 7 folded
// onto 6 (three instructions, no multiply: it is on every lookup's path).
func stripeOf(b uint64) uint64 {
	return min(b&7, stripes-1)
}

// versions are a shard's stripes.
type versions [stripes]atomic.Uint64

// open makes the stripes of buckets p and q odd: a move between them
// begins. p and q may share a stripe.
func (vs *versions) open(p, q uint64) {
	sp, sq := stripeOf(p), stripeOf(q)
	vs[sp].Add(1)
	if sq != sp {
		vs[sq].Add(1)
	}
}

// close makes the stripes of buckets p and q even again: the move ended.
func (vs *versions) close(p, q uint64) {
	vs.open(p, q)
}

// openMask bumps every stripe whose bit is set in mask: odd when a move
// begins, even again when it ends (call it twice with the same mask).
func (vs *versions) openMask(mask uint64) {
	for i := range vs {
		if mask>>i&1 != 0 {
			vs[i].Add(1)
		}
	}
}

// allStripes is the mask of every stripe, for a move that lookups may
// look for in any bucket (a table swap with its stash).
const allStripes = 1<<stripes - 1

// stable reports whether stripe a, read as va before a lookup's reads, is
// even and unchanged now: the lookup overlapped no move through the
// bucket whose stripe a is.
func (vs *versions) stable(a, va uint64) bool {
	return va&1 == 0 && vs[a].Load() == va
}
