package shard

// Huge pages. A table larger than what the CPU's TLB maps with 4 KiB pages
// (a few thousand entries: 6–12 MiB) costs a lookup a page walk per
// bucket besides the miss itself, and on a virtual machine a walk of two
// page tables. Backed by 2 MiB pages, a table of hundreds of MiB fits in
// the TLB. Linux backs memory with transparent huge pages where the
// process asks for them (madvise(MADV_HUGEPAGE), the default mode of most
// distributions) or everywhere (mode "always"); the Go heap does not ask.
//
// A table is an ordinary heap allocation, and the shards of a large guard
// have many small tables (64 KiB each for 16M keys), so the advice covers
// the 2 MiB-aligned range around a table: the neighbours in that range are
// other heap memory, mostly the shard's siblings, allocated one after the
// other. The cost is at most the two partial huge pages at the ends of
// such a run, once; the heap's own accounting (Stats, the memory cap) is
// unchanged.
//
// The kernel gives a huge page on the first write to a 2 MiB range of
// which no page is resident. Memory that the Go heap reuses without having
// returned it to the kernel is resident already (the allocator zeroed it),
// so a table made there stays in 4 KiB pages until the kernel's khugepaged
// gets to it (by default 16 MiB every 10 s). So when a guard is made or
// restored, a table whose memory is resident already is copied into huge
// pages at once (MADV_COLLAPSE, Linux 6.1 and later). Measured over
// 256 MiB of 64 KiB tables in reused memory on the 2-vCPU Xeon: 0 kB in
// huge pages with the advice alone, 256 MiB with the collapse, which cost
// 106–340 ms; in fresh memory the advice alone gives 256 MiB and costs
// 1–4 ms. (Releasing an empty table's pages with MADV_DONTNEED instead
// left them in 4 KiB pages: the page tables stay.) A doubling's new table
// is only advised: a copy would hold the shard's mutex.

// HugePagesMin is the memory, in bytes, from which the shards under one
// growth policy ([Growth.UsedBytes]) back the tables that their doublings
// make with huge pages, where the platform has them: above the 6–12 MiB
// that a TLB of 4 KiB pages maps. Package guard advises the tables of a
// guard of this size or more when it makes it ([Shard.AdviseHugePages]).
const HugePagesMin = 16 << 20

// AdviseHugePages asks the operating system to back the shard's tables
// with huge pages: the current one, at once where its memory is in use
// already (a copy), and every table its doublings make (Linux: see
// hugepages.go). It is a hint, which a platform without transparent huge
// pages ignores; the shard's answers do not depend on it. It takes the
// shard's mutex for as long as the copy takes (about 1 ms per MiB).
func (s *Shard) AdviseHugePages() {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tab.Load()
	for _, tt := range [2]*table{t, t.next.Load()} {
		if tt != nil && !tt.huge {
			tt.huge = true
			adviseHugePages(tt.buckets, true)
		}
	}
}

// newTableLocked returns a table of 2^k buckets for the shard's next
// doubling, advised to be backed by huge pages if the current one was or
// the shard's growth policy holds HugePagesMin bytes or more. The caller
// holds s.mu.
func (s *Shard) newTableLocked(k uint8) *table {
	nt := newTable(k)
	if s.tab.Load().huge || s.growth != nil && s.growth.UsedBytes() >= HugePagesMin {
		nt.huge = true
		adviseHugePages(nt.buckets, false)
	}
	return nt
}
