package shard

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// naiveMatches is matches lane by lane, with slotMatches.
func naiveMatches(w uint64, f uint8, pb uint64) bool {
	for i := range slotsPerBucket {
		if slotMatches(laneOf(w, i), f, pb) {
			return true
		}
	}
	return false
}

// randomSlot returns a valid slot (fingerprint 1..255, a tail of random
// length), or 0 (empty) one time in five.
func randomSlot(r *rand.Rand) uint64 {
	if r.IntN(5) == 0 {
		return 0
	}
	return makeSlot(uint8(r.IntN(255)+1), r.Uint64()&0xff, r.IntN(MaxTailBits+1))
}

func randomBucket(r *rand.Rand) uint64 {
	var w uint64
	for i := range slotsPerBucket {
		w = withLane(w, i, randomSlot(r))
	}
	return w
}

func TestSWARMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 500_000 {
		w := randomBucket(r)
		f, pb := uint8(r.IntN(255)+1), r.Uint64()&0xff
		if r.IntN(2) == 0 { // a probe that agrees with some lane's fingerprint
			if s := laneOf(w, r.IntN(slotsPerBucket)); s != 0 {
				f = uint8(s >> 8)
				if r.IntN(2) == 0 {
					pb = s&0xff | r.Uint64()&(s&0xff^(s&0xff-1))>>1 // its tail, random below
				}
			}
		}
		p := probeOf(f, pb)
		if got, want := matches(w, p), naiveMatches(w, f, pb); got != want {
			t.Fatalf("matches(%#016x, f=%#x pb=%#02x) = %v, want %v", w, f, pb, got, want)
		}
		lanes := matchLanes(w, p)
		for i := range slotsPerBucket {
			if got, want := lanes>>(16*i+15)&1 == 1, slotMatches(laneOf(w, i), f, pb); got != want {
				t.Fatalf("matchLanes(%#016x) lane %d = %v, want %v", w, i, got, want)
			}
		}
		s := laneOf(w, r.IntN(slotsPerBucket))
		n := 0
		free := -1
		for i := range slotsPerBucket {
			if laneOf(w, i) == s && s != 0 {
				n++
			}
			if laneOf(w, i) == 0 && free < 0 {
				free = i
			}
		}
		if s != 0 {
			if got := equalLanes(w, s); got != n {
				t.Fatalf("equalLanes(%#016x, %#04x) = %d, want %d", w, s, got, n)
			}
			if !hasSlot(w, s) {
				t.Fatalf("hasSlot(%#016x, %#04x) = false", w, s)
			}
		}
		if got := freeLane(w); got != free {
			t.Fatalf("freeLane(%#016x) = %d, want %d", w, got, free)
		}
		occupied := 0
		for i := range slotsPerBucket {
			if laneOf(w, i) != 0 {
				occupied++
			}
		}
		if got := countSlots(w); got != occupied {
			t.Fatalf("countSlots(%#016x) = %d, want %d", w, got, occupied)
		}
	}
}

// TestSlotLayout checks the slot encoding: the terminator gives the tail
// length, a slot matches exactly the probes that agree with its tail, and
// a split gives up the tail's first bit.
func TestSlotLayout(t *testing.T) {
	for tl := range MaxTailBits + 1 {
		for pb := range uint64(256) {
			s := makeSlot(0x5a, pb, tl)
			if s == 0 || tailLen(s) != tl || s>>8 != 0x5a {
				t.Fatalf("makeSlot(0x5a, %#02x, %d) = %#04x (tail length %d)", pb, tl, s, tailLen(s))
			}
			for q := range uint64(256) {
				agree := (q^pb)>>(8-tl) == 0 || tl == 0
				if got := slotMatches(s, 0x5a, q); got != agree {
					t.Fatalf("slot %#04x (t=%d) matches probe byte %#02x: %v, want %v", s, tl, q, got, agree)
				}
			}
			ns, bit, ok := splitSlot(s)
			if tl == 0 {
				if ok || ns != s {
					t.Fatalf("split of void slot %#04x = %#04x, %v", s, ns, ok)
				}
				continue
			}
			if !ok || bit != pb>>7 || tailLen(ns) != tl-1 || ns != makeSlot(0x5a, pb<<1&0xff, tl-1) {
				t.Fatalf("split of %#04x (t=%d) = %#04x, bit %d", s, tl, ns, bit)
			}
		}
	}
}

// TestOtherIsAnInvolution checks that an entry's alternate of its
// alternate is the entry itself, at every table size and tail length, and
// that the alternate is what an item at the XORed position gets.
func TestOtherIsAnInvolution(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for k := uint8(1); k <= VirtualBits; k++ {
		tb := newTableHeader(k)
		for range 2000 {
			f := uint8(r.IntN(255) + 1)
			v := r.Uint64() & positionMask
			b1, s1, b2, s2 := tb.slots(f, v, alt(f))
			if b1 == b2 {
				t.Fatalf("k=%d: both candidates in bucket %d", k, b1)
			}
			if ob, os := tb.other(b1, s1); ob != b2 || os != s2 {
				t.Fatalf("k=%d: other(%d, %#04x) = %d, %#04x; want %d, %#04x", k, b1, s1, ob, os, b2, s2)
			}
			if ob, os := tb.other(b2, s2); ob != b1 || os != s1 {
				t.Fatalf("k=%d: other(%d, %#04x) = %d, %#04x; want %d, %#04x", k, b2, s2, ob, os, b1, s1)
			}
			// A shortened (older) entry keeps the relation.
			tl := r.IntN(tb.tnew() + 1)
			short := makeSlot(f, s1&0xff, tl)
			ob, os := tb.other(b1, short)
			if ob != b2 || os != makeSlot(f, s2&0xff, tl) {
				t.Fatalf("k=%d t=%d: other(%d, %#04x) = %d, %#04x", k, tl, b1, short, ob, os)
			}
		}
	}
}

func TestSplitBucketKeepsEverySlot(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 200_000 {
		w := randomBucket(r)
		var hist [MaxTailBits + 1]int64
		lo, hi, voids := splitBucket(w, &hist)
		want := countSlots(w)
		if got := countSlots(lo) + countSlots(hi); got != want+voids {
			t.Fatalf("split of %#016x holds %d slots, want %d (+%d voids)", w, got, want, voids)
		}
		total := int64(0)
		for _, n := range hist {
			total += n
		}
		if total != int64(want+voids) {
			t.Fatalf("split of %#016x counted %d entries, want %d", w, total, want+voids)
		}
		for i := range slotsPerBucket {
			s := laneOf(w, i)
			if s == 0 {
				continue
			}
			ns, bit, ok := splitSlot(s)
			switch {
			case !ok && (!hasSlot(lo, ns) || !hasSlot(hi, ns)):
				t.Fatalf("void slot %#04x of %#016x not in both children", s, w)
			case ok && bit == 0 && !hasSlot(lo, ns), ok && bit == 1 && !hasSlot(hi, ns):
				t.Fatalf("slot %#04x of %#016x missing from child %d after the split", s, w, bit)
			}
		}
	}
}

func TestShardSize(t *testing.T) {
	var s Shard
	if off := unsafe.Offsetof(s.writeSide); off < 64 {
		t.Errorf("Shard write side at offset %d, want >= 64 (off the readers' cache line)", off)
	}
	if shardBytes%64 != 0 {
		t.Fatalf("unsafe.Sizeof(Shard{}) = %d, want a multiple of 64 (cache-line padding)", shardBytes)
	}
	// Two lines, one for readers and one for writers: every guard pays
	// for this once per shard, so a field that spills the write side into
	// a third line costs 64 bytes a shard.
	if shardBytes > 2*cacheLine {
		t.Errorf("unsafe.Sizeof(Shard{}) = %d, want at most two cache lines", shardBytes)
	}
}
