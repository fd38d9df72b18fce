package shard

import (
	"testing"
	"unsafe"
)

// TestTableLayout checks that what lookups read of a table header shares
// no cache line with the tail histogram, which inserts and deletes write:
// a shared line costs every lookup of the shard on another core a miss
// after each write (issue 34).
func TestTableLayout(t *testing.T) {
	var tab table
	if n := unsafe.Sizeof(tab.tableLookup); n > cacheLine {
		t.Errorf("the lookups' part of a table header takes %d bytes, want at most one cache line (%d)", n, cacheLine)
	}
	if off := unsafe.Offsetof(tab.tails); off%cacheLine != 0 || off < unsafe.Sizeof(tab.tableLookup) {
		t.Errorf("tails at offset %d, want a line of its own after the lookups' part (%d bytes)", off, unsafe.Sizeof(tab.tableLookup))
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
