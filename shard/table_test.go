package shard

import (
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// TestTableLayout checks that what lookups read of a table header shares
// no cache line with what writers write there (the tail histogram and
// fullAt): a shared line costs every lookup of the shard on another core
// a miss after each such write (issue 34).
func TestTableLayout(t *testing.T) {
	var tab table
	if n := unsafe.Sizeof(tab.tableLookup); n > cacheLine {
		t.Errorf("the lookups' part of a table header takes %d bytes, want at most one cache line (%d)", n, cacheLine)
	}
	if off := unsafe.Offsetof(tab.tails); off%cacheLine != 0 || off < unsafe.Sizeof(tab.tableLookup) {
		t.Errorf("tails at offset %d, want the writers' line after the lookups' part (%d bytes)", off, unsafe.Sizeof(tab.tableLookup))
	}
	// Two lines: each shard holds one header (two while it doubles).
	if n := unsafe.Sizeof(tab); n != 2*cacheLine {
		t.Errorf("unsafe.Sizeof(table{}) = %d, want two cache lines", n)
	}
	// The lines are the cache's only if the allocator puts headers on a
	// line boundary, as it does for a size class of whole lines. (The
	// tables of shards: a table that does not escape may live on the
	// stack, aligned to a word only.)
	for k := 1; k <= 16; k++ {
		s := mustNew(t, k)
		if p := uintptr(unsafe.Pointer(s.tab.Load())); p%cacheLine != 0 {
			t.Fatalf("table header at %#x, want it aligned to %d bytes", p, cacheLine)
		}
	}
}

// slotTails counts the entries of the current table of s, stash included,
// by tail length. s must not be doubling.
func slotTails(s *Shard) (h [MaxTailBits + 1]int) {
	t := s.tab.Load()
	for _, w := range t.buckets {
		for i := range slotsPerBucket {
			if sl := laneOf(w, i); sl != 0 {
				h[tailLen(sl)]++
			}
		}
	}
	for _, e := range t.stashEntries() {
		h[tailLen(e&laneMask)]++
	}
	return h
}

// TestHistogramMatchesSlots checks that Stats' tail histogram counts the
// entries the table holds, in an exact table (which keeps no counts) and
// in doubled ones (which do), through inserts that evict and stash and
// through deletes.
func TestHistogramMatchesSlots(t *testing.T) {
	seed := testrand.Seed(t)
	r := rand.New(rand.NewPCG(seed, 34))
	s := mustNew(t, 6)
	if !s.tab.Load().exact {
		t.Fatal("a new shard's table is not exact")
	}
	var in []item
	for doubling := 0; doubling < 4; doubling++ {
		for round := 0; round < 20; round++ {
			// Fill to the brim (evicting, then stashing), then delete a
			// few and check.
			for {
				it := randomItem(r)
				if err := s.Insert(it.f, it.v); err != nil {
					break
				}
				in = append(in, it)
			}
			for range 1 + r.IntN(len(in)/8) {
				i := r.IntN(len(in))
				if !s.Delete(in[i].f, in[i].v) {
					t.Fatalf("Delete(%+v) = false", in[i])
				}
				in[i] = in[len(in)-1]
				in = in[:len(in)-1]
			}
			st := s.Stats()
			if want := slotTails(s); st.Tails != want {
				t.Fatalf("after %d doublings: Stats().Tails = %v, want %v (the slots' tails)", doubling, st.Tails, want)
			}
		}
		if err := s.Grow(); err != nil {
			t.Fatal(err)
		}
	}
}
