package shard

// collisionProb is the probability that two independent fingerprints
// f = max(b, 1) of a uniform byte b are equal: f = 1 has probability 2/256,
// every other value 1/256, so the sum of squares is (4 + 254)/65536.
const collisionProb = (4.0 + 254.0) / 65536.0

// Stats describes one shard at one moment. It is not a consistent snapshot
// when writers run concurrently.
type Stats struct {
	Items           int     // items stored, counting duplicates
	Buckets         int     // buckets in the current table
	Slots           int     // Buckets × 4
	Stashed         int     // items parked in the stash
	TailBits        int     // T: doublings left before saturation (of the new table while Growing)
	FingerprintBits int     // F + T: bits a lookup compares per slot
	Doublings       int     // times the shard has doubled
	Bytes           int     // memory of the shard and its table
	LoadFactor      float64 // Items / Slots
	EstimatedFPR    float64 // expected false-positive rate of a lookup
	ReadRetries     uint64  // lookups that retried because a writer moved items
	Growing         bool    // a doubling is in progress
	MigratedBuckets int     // old buckets split so far, while Growing
}

// Stats returns the shard's statistics. It takes no lock.
func (s *Shard) Stats() Stats {
	t := s.tab.Load()
	items := s.Len()
	st := Stats{
		Items:     items,
		Buckets:   len(t.buckets),
		Stashed:   int(t.stashN.Load()),
		TailBits:  int(t.t),
		Doublings: s.Doublings(),
		Bytes:     BytesFor(int(t.k)),
	}
	if nt := t.next.Load(); nt != nil {
		// Mid-doubling: report the table being filled, count both tables'
		// memory and stashes.
		st.Growing = true
		st.MigratedBuckets = int(t.cursor.Load())
		st.Buckets = len(nt.buckets)
		st.Stashed += int(nt.stashN.Load())
		st.TailBits = int(nt.t)
		st.Bytes += tableHeaderBytes + 8*len(nt.buckets)
	}
	st.Slots = st.Buckets * slotsPerBucket
	st.FingerprintBits = FingerprintBits + st.TailBits
	st.LoadFactor = float64(items) / float64(st.Slots)
	st.EstimatedFPR = EstimatedFPR(st.LoadFactor, st.TailBits)
	st.ReadRetries = s.retries.Load()
	return st
}

// EstimatedFPR returns the expected false-positive rate of a lookup in a
// shard at the given load factor with tailBits tail bits: a lookup compares
// 2·4 slots, each occupied with probability load and matching with
// probability about 1/(255·2^T). For small rates this is
// 8·load/2^(8+T).
func EstimatedFPR(load float64, tailBits int) float64 {
	p := collisionProb / float64(uint64(1)<<tailBits)
	return 2 * slotsPerBucket * load * p
}

// BytesFor returns the memory of a shard with 2^log2Buckets buckets: its
// table plus fixed overhead.
func BytesFor(log2Buckets int) int {
	return shardBytes + tableHeaderBytes + 8<<log2Buckets
}
