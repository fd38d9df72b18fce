package shard

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestHugePagesAdvised checks, where the kernel has transparent huge pages,
// that the advice reaches it: the mapping that holds an advised table has
// the flag of madvise(MADV_HUGEPAGE) ("hg" in /proc/self/smaps).
func TestHugePagesAdvised(t *testing.T) {
	if hugePageSize() == 0 {
		t.Skip("no transparent huge pages to ask for here")
	}
	s := mustNew(t, 20) // 8 MiB
	before := vmFlags(t, s.tab.Load().buckets)
	if hasFlag(before, "hg") {
		t.Skipf("the table's mapping has the flag already: %q", before)
	}
	// A control, advised directly: where madvise's effect does not show
	// in smaps (under qemu-user, which does not pass it on), there is
	// nothing to check.
	control := make([]uint64, 1<<20)
	if err := unix.Madvise(unsafe.Slice((*byte)(unsafe.Pointer(&control[0])), 8*len(control)), unix.MADV_HUGEPAGE); err != nil {
		t.Skip(err)
	}
	if f := vmFlags(t, control); !hasFlag(f, "hg") {
		t.Skipf("madvise(MADV_HUGEPAGE) does not show in /proc/self/smaps here (VmFlags %q)", f)
	}
	s.AdviseHugePages()
	after := vmFlags(t, s.tab.Load().buckets)
	if !hasFlag(after, "hg") {
		t.Fatalf("VmFlags of the table's mapping: %q before the advice, %q after; want hg", before, after)
	}
}

// hasFlag reports whether the VmFlags value flags holds flag.
func hasFlag(flags, flag string) bool {
	return strings.Contains(" "+flags+" ", " "+flag+" ")
}

// vmFlags returns the VmFlags line of the mapping in /proc/self/smaps that
// holds b's first element.
func vmFlags(t *testing.T, b []uint64) string {
	t.Helper()
	p := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := mappingRange(line); ok {
			in = lo <= p && p < hi
			continue
		}
		if v, ok := strings.CutPrefix(line, "VmFlags:"); ok && in {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no mapping in /proc/self/smaps holds %#x", p)
	return ""
}

// mappingRange parses the "lo-hi perms ..." header line of a mapping.
func mappingRange(line string) (lo, hi uint64, ok bool) {
	r, _, found := strings.Cut(line, " ")
	l, h, dash := strings.Cut(r, "-")
	if !found || !dash {
		return 0, 0, false
	}
	lo, err1 := strconv.ParseUint(l, 16, 64)
	hi, err2 := strconv.ParseUint(h, 16, 64)
	return lo, hi, err1 == nil && err2 == nil
}
