package shard

import "math/bits"

// A bucket is one uint64 holding four 16-bit lanes. A lane is 0 when the
// slot is empty; a stored slot is never 0 (see slot.go).
const (
	slotsPerBucket = 4
	laneBits       = 16
	laneMask       = 1<<laneBits - 1

	lanesLow  = 0x0001_0001_0001_0001 // the value 1 in every lane
	lanesHigh = 0x8000_8000_8000_8000 // the top bit of every lane
	lowBytes  = 0x00ff_00ff_00ff_00ff // the tail byte of every lane
	stoppers  = 0x0100_0100_0100_0100 // bit 8 of every lane
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

// exactZeroLanes returns a word whose lane i has its top bit set if and
// only if lane i of x is zero: no borrow crosses lanes.
func exactZeroLanes(x uint64) uint64 {
	const low15 = ^uint64(lanesHigh)
	return ^((x&low15 + low15) | x) & lanesHigh
}

// matches reports whether some lane of bucket w holds a slot that matches
// the probe p (see probe): the fingerprint byte is equal and every tail bit
// the lane keeps equals the probe's bit there. Lanes keep tails of
// different lengths; each lane's own terminator (its lowest set bit) says
// how many of the probe's bits to compare. It has no branches and no loop.
//
// Per lane, L is the tail byte with a stop bit above it, so that L-1 never
// borrows out of the lane; L^(L-1) is the terminator and every bit below
// it, which the comparison ignores. An empty lane compares only its
// fingerprint byte, 0, which no probe has.
func matches(w, p uint64) bool {
	l := w&lowBytes | stoppers
	below := (l ^ (l - lanesLow)) & lowBytes
	return zeroLanes((w^p)&^below) != 0
}

// matchLanes is matches lane by lane: bit 16i+15 of the result is set if
// and only if lane i of w matches probe p.
func matchLanes(w, p uint64) uint64 {
	l := w&lowBytes | stoppers
	below := (l ^ (l - lanesLow)) & lowBytes
	return exactZeroLanes((w ^ p) &^ below)
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

// equalLanes returns the number of lanes of b equal to the slot value s.
func equalLanes(b, s uint64) int {
	return bits.OnesCount64(exactZeroLanes(b ^ s*lanesLow))
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
