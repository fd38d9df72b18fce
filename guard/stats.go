package guard

import (
	"time"

	"github.com/cuckooguard/cuckooguard/shard"
)

// Stats describes a Guard. It is read shard by shard without locking, so it
// does not necessarily correspond to any consistent snapshot while writers
// run.
type Stats struct {
	Items             int     // keys in the set, counting copies added
	Copies            int     // occupied slots: Items plus the copies of void entries (see the package doc)
	VoidCopies        int     // occupied slots whose entries have no tail bits left
	Shards            int     // number of shards
	Slots             int     // fingerprint slots over all shards
	Bytes             int     // heap memory of the guard: shards, tables, stashes, counters, background resizer
	ReservedBytes     int     // what the memory cap counts: Bytes with every stash counted full; Bytes ≤ ReservedBytes ≤ MaxBytes
	MaxBytes          int     // the memory cap (WithMaxBytes); 0 for none
	GrowThreshold     float64 // the load factor at which a shard doubles (WithGrowThreshold)
	LoadFactor        float64 // Copies / Slots
	BitsPerItem       float64 // 8·Bytes / Items (0 when empty)
	EstimatedFPR      float64 // expected false-positive rate of a lookup of an absent key
	Doublings         int     // doublings over all shards
	MaxDoublings      int     // doublings of the shard that doubled most
	SaturatedShards   int     // shards whose table uses every position bit (2^40 buckets)
	Adds              uint64  // successful adds
	Removes           uint64  // successful removes
	AddFailures       uint64  // adds that returned ErrFull since New or Restore
	DegradedShards    int     // shards that refused an add with ErrFull, or were marked so, ever (Guard.Degraded; snapshots keep it)
	DuplicatesRefused uint64  // adds that returned ErrTooManyCopies
	ReadRetries       uint64  // lookups that retried because a writer moved fingerprints

	MigrationsInFlight  int           // background doublings running now
	MigrationsQueued    int           // shards waiting for a background worker
	MigrationsCompleted int64         // doublings the background workers ran (Doublings counts those of Add too)
	MigrationsRefused   int64         // doublings refused by the memory cap
	TimeMigrating       time.Duration // total time the background workers spent doubling

	PerShard []ShardStats // per shard: items, copies, tail lengths, doublings, …
}

// ShardStats describes one shard of a guard, as [Stats] does the guard.
type ShardStats struct {
	Items             int                        // keys in the shard, counting copies added
	Inserts           uint64                     // adds to the shard, and the keys Restore read into it; only grows
	Deletes           uint64                     // removes from the shard; only grows
	Copies            int                        // occupied slots: Items plus the copies of void entries
	Buckets           int                        // buckets of four slots (of the new table while Growing)
	Slots             int                        // Buckets × 4
	Stashed           int                        // entries parked in the stash
	Doublings         int                        // times the shard has doubled
	Tails             [shard.MaxTailBits + 1]int // entries by tail length; Tails[0] are void
	Bytes             int                        // heap memory of the shard and its tables
	LoadFactor        float64                    // Copies / Slots
	EstimatedFPR      float64                    // expected false-positive rate of a lookup routed here
	ReadRetries       uint64                     // lookups that retried because a writer moved fingerprints
	DuplicatesRefused uint64                     // adds refused with ErrTooManyCopies
	Growing           bool                       // a doubling is in progress
	MigratedBuckets   int                        // old buckets split so far, while Growing
	Degraded          bool                       // the shard refused an add with ErrFull, or was marked so (Guard.Degraded)
}

// shardStats is s as a guard reports it: guard's own type, so that package
// shard's can change without breaking guard users.
func shardStats(s shard.Stats) ShardStats {
	return ShardStats{
		Items: s.Items, Inserts: s.Inserts, Deletes: s.Deletes, Copies: s.Copies, Buckets: s.Buckets, Slots: s.Slots,
		Stashed: s.Stashed, Doublings: s.Doublings, Tails: s.Tails, Bytes: s.Bytes,
		LoadFactor: s.LoadFactor, EstimatedFPR: s.EstimatedFPR,
		ReadRetries: s.ReadRetries, DuplicatesRefused: s.DuplicatesRefused,
		Growing: s.Growing, MigratedBuckets: s.MigratedBuckets,
	}
}

// Stats returns the guard's statistics. It costs O(shards) and takes no
// lock.
func (g *Guard) Stats() Stats {
	rs := g.rs.Stats()
	st := Stats{
		Shards:            len(g.shards),
		Bytes:             fixedBytes(g.lay),
		ReservedBytes:     int(g.growth.UsedBytes()),
		MaxBytes:          g.cfg.maxBytes,
		GrowThreshold:     g.cfg.growThreshold,
		AddFailures:       uint64(g.failures.Value()),
		DuplicatesRefused: uint64(g.dupRefused.Value()),

		MigrationsInFlight:  rs.InFlight,
		MigrationsQueued:    rs.Queued,
		MigrationsCompleted: rs.Completed,
		MigrationsRefused:   g.growth.Refused(),
		TimeMigrating:       rs.TimeGrowing,
		PerShard:            make([]ShardStats, len(g.shards)),
	}
	var fpr float64
	var inserts uint64
	for i := range g.shards {
		s := g.shards[i].Stats()
		st.PerShard[i] = shardStats(s)
		if g.Degraded(i) {
			st.PerShard[i].Degraded = true
			st.DegradedShards++
		}
		st.Items += s.Items
		inserts += s.Inserts
		st.Removes += s.Deletes
		st.Copies += s.Copies
		st.VoidCopies += s.Tails[0]
		st.Slots += s.Slots
		st.Bytes += s.Bytes
		st.Doublings += s.Doublings
		st.MaxDoublings = max(st.MaxDoublings, s.Doublings)
		st.ReadRetries += s.ReadRetries
		if g.shards[i].Saturated() {
			st.SaturatedShards++
		}
		// A shard sees lookups in proportion to its routing share.
		fpr += s.EstimatedFPR * g.lay.share(i)
	}
	st.Adds = inserts - g.restored // the shards count Restore's keys as inserts
	st.EstimatedFPR = fpr
	st.LoadFactor = float64(st.Copies) / float64(st.Slots)
	if st.Items > 0 {
		st.BitsPerItem = 8 * float64(st.Bytes) / float64(st.Items)
	}
	return st
}
