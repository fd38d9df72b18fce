package shard

// collisionProb is the probability that two independent fingerprints
// f = max(b, 1) of uniform bytes b are equal: f = 1 has probability 2/256,
// every other value 1/256, so the sum of squares is (4 + 254)/65536.
const collisionProb = (4.0 + 254.0) / 65536.0

// Stats describes one shard at one moment. It is not a consistent snapshot
// when writers run concurrently.
type Stats struct {
	Items             int                  // items inserted and not deleted, counting repeated inserts
	Inserts           uint64               // successful inserts, and the items ReadFrom read; only grows
	Deletes           uint64               // successful deletes; only grows
	Copies            int                  // occupied slots: items plus the extra copies of void entries
	Buckets           int                  // buckets in the current table (the new one while Growing)
	Slots             int                  // Buckets × 4
	Stashed           int                  // entries parked in the stash
	Doublings         int                  // times the shard has doubled
	Tails             [MaxTailBits + 1]int // entries (copies) by tail length; Tails[0] are void
	Bytes             int                  // memory of the shard and its tables
	LoadFactor        float64              // Copies / Slots
	EstimatedFPR      float64              // expected false-positive rate of a lookup
	ReadRetries       uint64               // lookups that retried because a writer moved items
	DuplicatesRefused uint64               // inserts refused with ErrTooManyCopies
	Growing           bool                 // a doubling is in progress
	MigratedBuckets   int                  // old buckets split so far, while Growing
}

// Stats returns the shard's statistics. It takes no lock.
func (s *Shard) Stats() Stats {
	t := s.tab.Load()
	ins, del := s.counts()
	st := Stats{
		Inserts:           ins,
		Deletes:           del,
		Copies:            int(s.copiesNow()),
		Buckets:           len(t.buckets),
		Stashed:           int(t.stashN.Load()),
		Doublings:         s.Doublings(),
		Bytes:             s.fixedBytes() + tableBytes(len(t.buckets)) + stashBytes(int(t.stashN.Load())),
		ReadRetries:       s.retries.Load(),
		DuplicatesRefused: t.refused.Load(),
	}
	st.Items = int(st.Inserts - st.Deletes)
	st.Tails = t.histogram(st.Copies)
	if nt := t.next.Load(); nt != nil {
		// Mid-doubling: report the table being filled, count both tables'
		// memory and stashes. The histogram stays the old table's until
		// the doubling ends.
		st.Growing = true
		st.MigratedBuckets = int(t.cursor.Load())
		st.Buckets = len(nt.buckets)
		st.Stashed += int(nt.stashN.Load())
		st.Bytes += tableBytes(len(nt.buckets)) + stashBytes(int(nt.stashN.Load()))
		st.EstimatedFPR = EstimatedFPR(st.Tails, len(t.buckets))
	} else {
		st.EstimatedFPR = EstimatedFPR(st.Tails, st.Buckets)
	}
	st.Slots = st.Buckets * slotsPerBucket
	st.LoadFactor = float64(st.Copies) / float64(st.Slots)
	return st
}

// EstimatedFPR returns the expected false-positive rate of a lookup in a
// table of the given number of buckets holding tails[t] entries with a
// tail of t bits. A lookup of an absent item probes 2 buckets; an entry
// with a tail of t bits in one of them matches it with probability about
// collisionProb·2^-t (equal fingerprints, equal tails), so the rate is
// about 2·collisionProb·Σ tails[t]·2^-t / buckets: 8·α/(255·2^7) ≈ 2.2e-4
// for a table at load α = 0.9 whose entries all keep 7 tail bits.
func EstimatedFPR(tails [MaxTailBits + 1]int, buckets int) float64 {
	if buckets == 0 {
		return 0
	}
	sum := 0.0
	for t, n := range tails {
		sum += float64(n) / float64(uint(1)<<t)
	}
	return 2 * collisionProb * sum / float64(buckets)
}

// BytesFor returns the memory of an empty shard with 2^log2Buckets
// buckets: its table plus fixed overhead.
func BytesFor(log2Buckets int) int {
	return shardBytes + counterBytes(stripeCount(log2Buckets)) + tableBytes(1<<log2Buckets)
}
