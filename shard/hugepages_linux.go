package shard

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePageSize returns the size of the transparent huge pages the kernel
// backs an advised range with, or 0 if it backs none (mode "never", or no
// THP support) or they are larger than 2 MiB: the range advised is rounded
// out to whole huge pages, and 2 MiB keeps it inside the Go heap's arenas,
// which are aligned to 64 MiB (4 MiB on 32-bit platforms). Read once from
// sysfs, as the Go runtime reads the size.
var hugePageSize = sync.OnceValue(func() uintptr {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(mode), "[never]") {
		return 0
	}
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n == 0 || n > 2<<20 || n&(n-1) != 0 {
		return 0
	}
	return uintptr(n)
})

// adviseHugePages advises the kernel to back the huge pages that overlap
// b with huge pages (MADV_HUGEPAGE: the parts not resident get them as
// they are first written) and, if collapse and b's memory is resident
// already, to copy that range into huge pages now (MADV_COLLAPSE). Both
// are hints; errors are ignored.
func adviseHugePages(b []uint64, collapse bool) {
	size := hugePageSize()
	if size == 0 || len(b) == 0 {
		return
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	hb, he := p&^(size-1), (p+uintptr(len(b))*8+size-1)&^(size-1)
	unix.Syscall(unix.SYS_MADVISE, hb, he-hb, unix.MADV_HUGEPAGE)
	if collapse && resident(p) {
		unix.Syscall(unix.SYS_MADVISE, hb, he-hb, unix.MADV_COLLAPSE)
	}
}

// resident reports whether the page that holds address p is in memory.
func resident(p uintptr) bool {
	var vec [1]byte
	page := uintptr(os.Getpagesize())
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, p&^(page-1), 1, uintptr(unsafe.Pointer(&vec[0])))
	return errno == 0 && vec[0]&1 != 0
}
