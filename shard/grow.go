package shard

// Grow doubles the shard: every bucket j of the current table is split into
// buckets j and j+2^k of a new table with one tail bit fewer, by the lowest
// bit of each slot's tail, and the new table replaces the old one. Nothing
// is rehashed and nothing is evicted; each slot's fingerprint is kept, so
// the false-positive rate at a given load doubles. Grow returns
// [ErrSaturated] when no tail bits are left.
//
// Writers wait for Grow; lookups do not: they keep reading the old table,
// which holds every item until the new one is published.
func (s *Shard) Grow() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.growLocked()
}

// GrowFrom doubles the shard, as [Shard.Grow] does, only if it has doubled
// exactly doublings times so far, and reports whether it did. Callers that
// saw ErrFull pass the count they read before inserting, so that two
// callers racing on a full shard double it once.
func (s *Shard) GrowFrom(doublings int) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(s.doublings.Load()) != doublings {
		return false, nil
	}
	if err := s.growLocked(); err != nil {
		return false, err
	}
	return true, nil
}

// GrowAbove doubles the shard, as [Shard.Grow] does, if its load factor is
// at least threshold, and reports whether it did.
func (s *Shard) GrowAbove(threshold float64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.LoadFactor() < threshold {
		return false, nil
	}
	if err := s.growLocked(); err != nil {
		return false, err
	}
	return true, nil
}

func (s *Shard) growLocked() error {
	old := s.tab.Load()
	if old.t == 0 {
		return ErrSaturated
	}
	nt := newTable(old.k+1, old.t-1)
	half := uint64(len(old.buckets))
	for j := range old.buckets {
		// nt is not published yet: plain stores are enough.
		nt.buckets[j], nt.buckets[uint64(j)+half] = splitBucket(old.buckets[j], old.t)
	}
	for i := range old.stash {
		e := old.stash[i].Load()
		if e == 0 {
			continue
		}
		b, sl := splitSlot(e>>laneBits, e&laneMask, old.k, old.t)
		// The new table has room now; keep the stash only if it does not.
		if !nt.place(b, sl) {
			nt.stashPut(b, sl)
		}
	}
	// The old table stays intact and complete, so a reader that loaded it
	// still answers correctly. The bump makes readers that straddle the
	// swap retry anyway, which keeps the invariant simple: every change of
	// where a fingerprint lives happens under an odd sequence.
	s.seq.Add(1)
	s.tab.Store(nt)
	s.seq.Add(1)
	s.doublings.Add(1)
	return nil
}
