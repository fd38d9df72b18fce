// Package memsize rounds allocation sizes up as the Go runtime's allocator
// does, so that the memory figures of guard and shard match the heap that
// runtime.MemStats reports rather than the bytes asked for.
//
// The size classes are those of Go 1.22 to 1.26
// (internal/runtime/gc/sizeclasses.go); guard's TestStatsBytesMatchHeap
// fails if a release changes them enough to matter.
package memsize

import (
	"math/bits"
	"runtime"
)

// classes are the allocator's size classes for objects of up to
// maxSmall bytes.
var classes = [...]uint16{
	8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224,
	240, 256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768,
	896, 1024, 1152, 1280, 1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200,
	3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728,
	10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760,
	24576, 27264, 28672, 32768,
}

const (
	maxSmall = 32768
	pageSize = 8192
	// headerSize is the malloc header that an object holding pointers
	// carries when it is larger than minSizeForHeader bytes (one pointer
	// per pointer-sized word of a bitmap word).
	headerSize = 8
)

// minSizeForHeader is 512 bytes on 64-bit platforms, 128 on 32-bit ones.
const minSizeForHeader = (bits.UintSize / 8) * bits.UintSize

// Of returns the bytes the allocator takes for one object of n bytes.
// pointers says whether the object holds pointers: one larger than 512
// bytes (on 64-bit platforms) then carries an 8-byte header.
func Of(n int, pointers bool) int {
	if n <= 0 {
		return 0
	}
	if pointers && n > minSizeForHeader && n <= maxSmall-headerSize {
		n += headerSize
	}
	if n > maxSmall {
		return (n + pageSize - 1) / pageSize * pageSize
	}
	lo, hi := 0, len(classes)-1
	for lo < hi {
		m := (lo + hi) / 2
		if int(classes[m]) >= n {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return int(classes[lo])
}

// LiveHeap returns the bytes of live heap objects after a full collection
// (two, so that objects freed by finalizers of the first are gone too):
// the figure that Of's sums are checked against, for tests and the bench
// tool that measure a guard's memory.
func LiveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
