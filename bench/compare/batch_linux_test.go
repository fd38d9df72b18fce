package compare

import (
	"syscall"
	"unsafe"
)

// madvCollapse is MADV_COLLAPSE (Linux 6.1), which package syscall lacks.
const madvCollapse = 25

// adviseRegion asks for the region's memory, not yet touched, to be backed
// by huge pages or not, and reports whether the kernel took the advice.
func adviseRegion(region []uint64, huge bool) bool {
	advice := syscall.MADV_NOHUGEPAGE
	if huge {
		advice = syscall.MADV_HUGEPAGE
	}
	return syscall.Madvise(bytesOf(region), advice) == nil
}

// collapseRegion moves the region's touched memory into huge pages now,
// where the kernel can (a region reused from an earlier one was touched
// before the advice).
func collapseRegion(region []uint64) {
	_ = syscall.Madvise(bytesOf(region), madvCollapse)
}

func bytesOf(region []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(region))), len(region)*8)
}
