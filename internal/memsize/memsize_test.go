package memsize

import (
	"runtime"
	"testing"
	"unsafe"
)

// ptrWord is one word that holds a pointer, so that a []ptrWord is
// scanned by the collector (and gets a malloc header when large).
type ptrWord = *int

const ptr = int(unsafe.Sizeof(ptrWord(nil)))

// heapPerObject allocates count objects of n bytes (rounded up to whole
// pointers if pointers) and returns the heap growth per object.
func heapPerObject(n int, pointers bool) int {
	const count = 64
	bs, ps := make([][]byte, count), make([][]ptrWord, count)
	before := LiveHeap()
	for i := range count {
		if pointers {
			ps[i] = make([]ptrWord, n/ptr)
		} else {
			bs[i] = make([]byte, n)
		}
	}
	after := LiveHeap()
	runtime.KeepAlive(bs)
	runtime.KeepAlive(ps)
	return int(after-before) / count
}

// TestOfMatchesAllocator allocates objects of many sizes, with and without
// pointers, and compares the heap growth with Of. Objects below 16 bytes
// without pointers share blocks (the tiny allocator) and are left out.
func TestOfMatchesAllocator(t *testing.T) {
	for _, n := range []int{24, 100, 120, 128, 500, 512, 520, 1000, 1536, 4000, 32760, 32768, 40000, 100000} {
		for _, pointers := range []bool{false, true} {
			size := n
			if pointers {
				size = (n + ptr - 1) / ptr * ptr
			}
			want := Of(size, pointers)
			// The runtime allocates for itself now and then; a size
			// class off is at least 8 bytes per object, every time.
			var got int
			for range 3 {
				if got = heapPerObject(size, pointers); got >= want-6 && got <= want+6 {
					break
				}
			}
			if got < want-6 || got > want+6 {
				t.Errorf("Of(%d, %v) = %d, heap grew by %d per object", size, pointers, want, got)
			}
		}
	}
}

func TestOfEdges(t *testing.T) {
	for _, c := range []struct {
		n        int
		pointers bool
		want     int
	}{
		{0, false, 0}, {-1, true, 0}, {1, false, 8}, {32768, false, 32768},
		{32769, false, 40960}, {minSizeForHeader, true, Of(minSizeForHeader, false)},
	} {
		if got := Of(c.n, c.pointers); got != c.want {
			t.Errorf("Of(%d, %v) = %d, want %d", c.n, c.pointers, got, c.want)
		}
	}
}
