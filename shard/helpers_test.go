package shard

import "math/bits"

// Helpers that only tests use: they read buckets and stripes in ways the
// shard itself never needs.

// hasSlot reports whether any lane of bucket b equals the slot value s.
func hasSlot(b, s uint64) bool {
	return zeroLanes(b^(s*lanesLow)) != 0
}

// countSlots returns the number of occupied lanes of b.
func countSlots(b uint64) int {
	return slotsPerBucket - bits.OnesCount64(exactZeroLanes(b))
}

// sum returns the sum of all stripes, a number that changes with every
// move anywhere in the shard (for tests).
func (vs *versions) sum() uint64 {
	var n uint64
	for i := range vs {
		n += vs[i].Load()
	}
	return n
}
