package shard

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
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
	s.AdviseHugePages()
	after := vmFlags(t, s.tab.Load().buckets)
	if !strings.Contains(" "+after+" ", " hg ") {
		t.Fatalf("VmFlags of the table's mapping: %q before the advice, %q after; want hg", before, after)
	}
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
