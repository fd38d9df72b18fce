package shard

// DefaultChunk is the number of buckets [Shard.Grow] splits per step, and a
// sensible chunk for [Shard.GrowStep]: a writer waits for at most one
// chunk, about a microsecond.
const DefaultChunk = 256

// A doubling splits every bucket j of the current table (2^k buckets)
// into buckets 2j and 2j+1 of a new table, by the first bit of each
// entry's tail, which the entry gives up. Nothing is rehashed and nothing
// is evicted. An entry with no tail left (void) is copied into both
// children; entries inserted into the new table get the longest tail again,
// so the false-positive rate grows with the number of doublings only
// slowly (see the package documentation).
//
// A doubling is incremental, in the style of the Go runtime's map growth:
// [Shard.BeginGrowFrom] allocates the new table, [Shard.GrowStep] splits the
// next chunk of buckets behind a cursor, and the step that passes the last
// bucket publishes the new table and drops the old one. Between steps the
// shard is fully usable: lookups resolve each of their two buckets through
// the cursor (old table if not split yet, new table otherwise) and never
// block; a writer that finds a free slot uses it, and a writer that would
// have to evict helps finish the doubling first. Every step runs under the
// shard's mutex, so a writer waits for at most one chunk. A split moves
// nothing a lookup can miss and bumps no version stripe; only the last
// step, which moves the stash and publishes the new table, makes every
// stripe odd, and a lookup that overlaps it retries a miss.

// beginGrow starts a doubling and reports whether it did: false if one is
// already in progress. It returns [ErrSaturated] if the shard has no tail
// bits left.
func (s *Shard) beginGrow() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.beginGrowLocked()
}

// BeginGrowFrom starts a doubling and reports whether it did: only if the
// shard has finished exactly doublings doublings (so that a caller that
// sized the doubling from what it read earlier does not begin a second
// one) and none is in progress. It returns [ErrSaturated] if the shard's
// table cannot double. [Shard.GrowStep] then runs the doubling, chunk by
// chunk; package resize does both.
func (s *Shard) BeginGrowFrom(doublings int) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(s.doublings.Load()) != doublings {
		return false, nil
	}
	return s.beginGrowLocked()
}

func (s *Shard) beginGrowLocked() (bool, error) {
	t := s.tab.Load()
	if t.next.Load() != nil {
		return false, nil
	}
	if t.k >= maxTableLog2 {
		return false, ErrSaturated
	}
	// Nothing moves yet (the cursor is 0), so readers need no retry.
	t.next.Store(newTable(t.k + 1))
	return true, nil
}

// GrowStep splits up to chunk buckets of a doubling in progress and reports
// whether no doubling remains in progress (it finished, or none had begun).
func (s *Shard) GrowStep(chunk int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.growStepLocked(max(chunk, 1))
}

func (s *Shard) growStepLocked(chunk int) bool {
	t := s.tab.Load()
	nt := t.next.Load()
	if nt == nil {
		return true
	}
	cur := t.cursor.Load()
	end := min(cur+uint64(chunk), uint64(len(t.buckets)))
	// The old table keeps every slot it splits, so a reader that resolved
	// a bucket with the old cursor still finds it there, and one that
	// resolves it to the new table after the cursor store finds the split
	// there: a split moves nothing lookups can miss, and bumps no stripe.
	var hist [MaxTailBits + 1]int64
	voids := 0
	for j := cur; j < end; j++ {
		// New buckets 2j and 2j+1 are fed by old bucket j only, and
		// writers put nothing there until the cursor passes j: plain
		// stores of the split are enough, atomic for concurrent readers.
		lo, hi, v := splitBucket(t.buckets[j], &hist)
		storeBucket(nt, 2*j, lo)
		storeBucket(nt, 2*j+1, hi)
		voids += v
	}
	for tl, n := range hist {
		if n != 0 {
			nt.tails[tl].Add(n)
		}
	}
	s.copies.Add(int64(voids))
	t.cursor.Store(end)
	if end == uint64(len(t.buckets)) {
		// The stash moves to the new table, whose bucket numbers differ
		// from the old one's: under every stripe.
		s.vers.openMask(allStripes)
		s.finishLocked(t, nt)
		s.vers.openMask(allStripes)
	}
	return end == uint64(len(t.buckets))
}

// finishLocked completes a doubling whose buckets are all split: it moves
// the old stash into the new table and publishes the new table. The caller
// holds s.mu with every stripe odd.
func (s *Shard) finishLocked(t, nt *table) {
	for _, e := range t.stashEntries() {
		b, sl := e>>laneBits, e&laneMask
		ns, bit, ok := splitSlot(sl)
		children := [2]uint64{2*b + bit}
		n := 1
		if !ok {
			children, n = [2]uint64{2 * b, 2*b + 1}, 2 // void: a copy in each
			s.copies.Add(1)
		}
		for _, c := range children[:n] {
			// The new table is about half full, so a free slot in either
			// bucket or an eviction path (the whole table is split by now)
			// almost always takes the entry. When neither can (its two
			// buckets full of entries no doubling tells apart, such as
			// void copies), it stays stashed: the stash may then hold more
			// than StashSize entries, which lookups check all the same.
			if !nt.place(c, ns) {
				oc, os := nt.other(c, ns)
				if _, err := s.kickLocked(nt, c, ns, oc, os, false); err != nil {
					nt.stashAdd(c, ns)
				}
			}
			nt.count(ns, 1)
		}
	}
	t.stash.Store(nil)
	t.stashN.Store(0)
	s.tab.Store(nt)
	s.doublings.Add(1)
	s.fullAt = 0
}

// finishGrowLocked runs a doubling in progress to the end without releasing
// the mutex.
func (s *Shard) finishGrowLocked() {
	for !s.growStepLocked(DefaultChunk) {
	}
}

// Grow doubles the shard now: it finishes a doubling in progress, or
// begins one and runs it to the end, releasing the mutex between chunks so
// that other writers of the shard wait for at most one chunk. Lookups never
// wait. It returns [ErrSaturated] once the table has 2^VirtualBits
// buckets.
func (s *Shard) Grow() error {
	if _, err := s.beginGrow(); err != nil {
		return err
	}
	for !s.GrowStep(DefaultChunk) {
	}
	return nil
}

// TableBytes returns the memory of the shard's current table, which a
// doubling releases when it finishes.
func (s *Shard) TableBytes() int {
	return tableBytes(len(s.tab.Load().buckets))
}

// Growing reports whether a doubling is in progress.
func (s *Shard) Growing() bool {
	return s.tab.Load().next.Load() != nil
}

// Saturated reports whether the shard can no longer double: its table
// has 2^VirtualBits buckets (2^27 on a 32-bit platform).
func (s *Shard) Saturated() bool {
	t := s.tab.Load()
	return t.k >= maxTableLog2 && t.next.Load() == nil
}

// NextGrowBytes returns the memory the next doubling allocates: a table
// twice the current one. While a doubling is in progress it returns 0.
func (s *Shard) NextGrowBytes() int {
	t := s.tab.Load()
	if t.next.Load() != nil {
		return 0
	}
	return tableBytes(2 * len(t.buckets))
}
