package shard

import "math/bits"

// A bucket is one uint64 holding four 16-bit lanes. A lane is 0 when the
// slot is empty; a stored slot is never 0 because its fingerprint part is
// never 0.
const (
	slotsPerBucket = 4
	laneBits       = 16
	laneMask       = 1<<laneBits - 1

	lanesLow  = 0x0001_0001_0001_0001 // the value 1 in every lane
	lanesHigh = 0x8000_8000_8000_8000 // the top bit of every lane
)

// zeroLanes returns a word whose lane i has its top bit set if lane i of x
// might be zero. It is nonzero if and only if some lane of x is zero, and
// its lowest set bit always marks a lane that really is zero (a borrow can
// only set flags above a true zero lane). This is the SWAR "has zero byte"
// expression of Hacker's Delight widened to 16-bit lanes; it has no
// branches.
func zeroLanes(x uint64) uint64 {
	return (x - lanesLow) &^ x & lanesHigh
}

// hasSlot reports whether any lane of bucket b equals the slot value s.
func hasSlot(b, s uint64) bool {
	return zeroLanes(b^(s*lanesLow)) != 0
}

// freeLane returns the index of the lowest empty lane of b, or -1 if b is
// full.
func freeLane(b uint64) int {
	z := zeroLanes(b)
	if z == 0 {
		return -1
	}
	return bits.TrailingZeros64(z) / laneBits
}

// findSlot returns the index of the lowest lane of b equal to s, or -1.
func findSlot(b, s uint64) int {
	z := zeroLanes(b ^ (s * lanesLow))
	if z == 0 {
		return -1
	}
	return bits.TrailingZeros64(z) / laneBits
}

// laneOf returns lane i of b.
func laneOf(b uint64, i int) uint64 {
	return b >> (i * laneBits) & laneMask
}

// withLane returns b with lane i set to s.
func withLane(b uint64, i int, s uint64) uint64 {
	sh := i * laneBits
	return b&^(laneMask<<sh) | s<<sh
}

// countSlots returns the number of occupied lanes of b.
func countSlots(b uint64) int {
	// Per lane, adding 0x7fff to the low 15 bits carries into the top bit
	// iff they are nonzero; lanes cannot carry into each other.
	const low15 = ^uint64(lanesHigh)
	y := (b&low15 + low15) | b
	return bits.OnesCount64(y & lanesHigh)
}
