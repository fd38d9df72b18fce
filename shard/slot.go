package shard

import "math/bits"

// A slot is 16 bits: the fingerprint f in the high byte, the tail byte in
// the low one. The tail byte holds the entry's tail, t bits of its
// position beyond its bucket (0 ≤ t ≤ MaxTailBits), most significant bit
// first from bit 7 down, then a 1 (the terminator), then zeros:
//
//	t = 7:  f | a b c d e f g 1
//	t = 3:  f | a b c 1 0 0 0 0
//	t = 0:  f | 1 0 0 0 0 0 0 0   (a void entry: no tail left)
//
// The terminator makes every entry carry its own tail length, and it makes
// a stored slot nonzero. Bit 7 is always the next bit of the position, the
// one the next doubling turns into a bucket bit, whatever the length; so
// one probe byte, the 8 position bits after the bucket, serves every
// lane: a lane compares the probe's bits above its terminator and ignores
// the rest (see matches).

// FingerprintBits is the width of the fingerprint.
const FingerprintBits = 8

// MaxTailBits is the longest tail a slot keeps: an entry inserted into a
// table of 2^k buckets keeps min(MaxTailBits, VirtualBits-k) bits of its
// position beyond the bucket.
const MaxTailBits = 7

// voidTail is the tail byte of a void entry, whose tail is empty.
const voidTail = 0x80

// tailLen returns the tail length of a stored slot.
func tailLen(s uint64) int {
	return MaxTailBits - bits.TrailingZeros8(uint8(s))
}

// makeSlot returns the slot of fingerprint f whose tail is the top t bits
// of the probe byte pb.
func makeSlot(f uint8, pb uint64, t int) uint64 {
	term := uint64(1) << (MaxTailBits - t)
	return uint64(f)<<8 | pb&^(2*term-1)&0xff | term
}

// probeOf returns the probe of fingerprint f and probe byte pb, replicated
// into every lane.
func probeOf(f uint8, pb uint64) uint64 {
	return (uint64(f)<<8 | pb) * lanesLow
}

// slotMatches reports whether slot s matches fingerprint f with probe byte
// pb: matches for one lane.
func slotMatches(s uint64, f uint8, pb uint64) bool {
	if s == 0 {
		return false
	}
	below := s ^ (s - 1) // the terminator and the zeros below it
	return (s^(uint64(f)<<8|pb))&^below == 0
}

// splitSlot returns the slot s becomes in the table twice as large, and
// the bit that picks its child bucket; ok is false for a void entry, which
// goes unchanged to both children.
func splitSlot(s uint64) (ns uint64, bit uint64, ok bool) {
	if s&0xff == voidTail {
		return s, 0, false
	}
	return s&^0xff | s<<1&0xff, s >> 7 & 1, true
}
