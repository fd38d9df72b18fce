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
	TailBits        int     // T: doublings left before saturation
	FingerprintBits int     // F + T: bits a lookup compares per slot
	Doublings       int     // times the shard has doubled
	Bytes           int     // memory of the shard and its table
	LoadFactor      float64 // Items / Slots
	EstimatedFPR    float64 // expected false-positive rate of a lookup
	ReadRetries     uint64  // lookups that retried because a writer moved items
}

// Stats returns the shard's statistics. It takes no lock.
func (s *Shard) Stats() Stats {
	t := s.tab.Load()
	items := s.Len()
	slots := len(t.buckets) * slotsPerBucket
	load := float64(items) / float64(slots)
	return Stats{
		Items:           items,
		Buckets:         len(t.buckets),
		Slots:           slots,
		Stashed:         int(t.stashN.Load()),
		TailBits:        int(t.t),
		FingerprintBits: FingerprintBits + int(t.t),
		Doublings:       s.Doublings(),
		Bytes:           BytesFor(int(t.k)),
		LoadFactor:      load,
		EstimatedFPR:    EstimatedFPR(load, int(t.t)),
		ReadRetries:     s.retries.Load(),
	}
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
