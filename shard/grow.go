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
// its first step allocates the new table, each [Shard.GrowStep] splits the
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
// already in progress. See beginGrowLocked for its errors.
func (s *Shard) beginGrow() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.beginGrowLocked()
}

// GrowStep advances the shard's growth by one step: it splits up to chunk
// buckets of the doubling in progress, and if there is none and
// [Shard.NeedsGrowth] holds, begins one first. It reports whether no
// doubling remains in progress (it finished, none was needed, or the
// memory cap has no room for one). Run it until it
// returns true to double a shard that needs it; package resize does so in
// the background. A writer of the shard waits for at most one step.
func (s *Shard) GrowStep(chunk int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tab.Load().next.Load() == nil {
		if !s.NeedsGrowth() {
			return true
		}
		if began, err := s.beginGrowLocked(); !began || err != nil {
			return true
		}
	}
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
		// The gate is closed (beginGrowLocked): no lock-free writer
		// changes bucket j after the split read it.
		lo, hi, v := splitBucket(t.load(j), &hist)
		storeBucket(nt, 2*j, lo)
		storeBucket(nt, 2*j+1, hi)
		voids += v
	}
	for tl, n := range hist {
		if n != 0 {
			nt.tails[tl].Add(n)
		}
	}
	s.addCopies(int64(voids))
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
			s.addCopies(1)
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
	nt.refused.Store(t.refused.Load())
	s.tab.Store(nt)
	s.doublings.Add(1)
	s.fullDeletes = 0
	s.due.Store(false)
	// Lock-free writers may write the new table (see counter.go).
	s.openGateLocked()
	if s.growth != nil {
		s.growth.used.Add(-t.reservedBytes())
	}
}

// finishGrowLocked runs a doubling in progress to the end without releasing
// the mutex.
func (s *Shard) finishGrowLocked() {
	for !s.growStepLocked(DefaultChunk) {
	}
}

// Grow doubles the shard now, whatever its load: it finishes a doubling in
// progress, or begins one and runs it to the end, releasing the mutex
// between chunks so that other writers of the shard wait for at most one
// chunk. Lookups never wait. It returns [ErrSaturated] once the table has
// 2^VirtualBits buckets, and an error wrapping [ErrFull] if the shard's
// growth policy has no memory for the new table.
func (s *Shard) Grow() error {
	if _, err := s.beginGrow(); err != nil {
		return err
	}
	for !s.GrowStep(DefaultChunk) {
	}
	return nil
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
