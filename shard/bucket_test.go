package shard

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// naive versions of the SWAR helpers, lane by lane.
func naiveHas(b, s uint64) bool {
	for i := range slotsPerBucket {
		if laneOf(b, i) == s {
			return true
		}
	}
	return false
}

func naiveFind(b, s uint64) int {
	for i := range slotsPerBucket {
		if laneOf(b, i) == s {
			return i
		}
	}
	return -1
}

func naiveCount(b uint64) int {
	n := 0
	for i := range slotsPerBucket {
		if laneOf(b, i) != 0 {
			n++
		}
	}
	return n
}

// randomBucket returns a bucket whose lanes are drawn from a small alphabet
// that includes 0, 0x8000 and 0xffff, so that equal lanes, empty lanes and
// lanes with the top bit set (where borrows matter) are common.
func randomBucket(r *rand.Rand) uint64 {
	alphabet := []uint64{0, 1, 2, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff}
	var b uint64
	for i := range slotsPerBucket {
		var s uint64
		if r.IntN(2) == 0 {
			s = alphabet[r.IntN(len(alphabet))]
		} else {
			s = r.Uint64() & laneMask
		}
		b = withLane(b, i, s)
	}
	return b
}

func TestSWARMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		b := randomBucket(r)
		s := laneOf(randomBucket(r), 0)
		if r.IntN(3) == 0 {
			s = laneOf(b, r.IntN(slotsPerBucket))
		}
		if s != 0 {
			if got, want := hasSlot(b, s), naiveHas(b, s); got != want {
				t.Fatalf("hasSlot(%#016x, %#04x) = %v, want %v", b, s, got, want)
			}
			if got, want := findSlot(b, s), naiveFind(b, s); got != want {
				t.Fatalf("findSlot(%#016x, %#04x) = %d, want %d", b, s, got, want)
			}
		}
		if got, want := freeLane(b), naiveFind(b, 0); got != want {
			t.Fatalf("freeLane(%#016x) = %d, want %d", b, got, want)
		}
		if got, want := countSlots(b), naiveCount(b); got != want {
			t.Fatalf("countSlots(%#016x) = %d, want %d", b, got, want)
		}
	}
}

func TestSplitBucketKeepsEverySlot(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for tail := uint8(1); tail <= InitialTailBits; tail++ {
		const k = 5
		for range 20_000 {
			var b uint64
			for i := range slotsPerBucket {
				if r.IntN(5) == 0 {
					continue
				}
				f := uint64(r.IntN(255) + 1)
				b = withLane(b, i, f<<tail|r.Uint64()&(1<<tail-1))
			}
			j := r.Uint64() & (1<<k - 1)
			lo, hi := splitBucket(b, tail)
			if got, want := countSlots(lo)+countSlots(hi), countSlots(b); got != want {
				t.Fatalf("tail=%d: split of %#016x holds %d slots, want %d", tail, b, got, want)
			}
			for i := range slotsPerBucket {
				s := laneOf(b, i)
				if s == 0 {
					continue
				}
				nb, ns := splitSlot(j, s, k, tail)
				into := lo
				if nb != j {
					into = hi
				}
				if nb != j && nb != j+1<<k {
					t.Fatalf("splitSlot moved bucket %d to %d", j, nb)
				}
				if !hasSlot(into, ns) {
					t.Fatalf("tail=%d: slot %#04x of %#016x missing after split (want %#04x in bucket %d)", tail, s, b, ns, nb)
				}
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
}
