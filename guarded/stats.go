package guarded

import "github.com/cuckooguard/cuckooguard/guard"

// Stats describes a Loader. Its counters are read one by one and do
// not necessarily form a consistent snapshot. Every lookup (Get, a key of
// GetMany) counts once in exactly one of Avoided, NegativeCacheHits,
// LetThrough and PassedThrough; [Loader.MayContain] counts nothing.
type Stats struct {
	Ready              bool        // the guard answers ErrNotFound on its own
	StoreCalls         uint64      // calls of the lookup function and of the batch lookup
	BatchCalls         uint64      // calls of the store's GetMany (BatchGetter)
	Avoided            uint64      // lookups answered ErrNotFound without the store
	LetThrough         uint64      // lookups the guard let through to the store: the key may exist
	FalsePositives     uint64      // store "not found" for keys the guard let through
	ObservedFPR        float64     // (FalsePositives + NegativeCacheHits) / (that + Avoided): see Stats
	NegativeCacheHits  uint64      // ErrNotFound from the negative cache
	PassedThrough      uint64      // lookups sent to the store unguarded (not ready, or a shard that refused a key)
	PassThroughShards  int         // shards that pass lookups through until the next rebuild
	Unsettled          int         // keys of inserts whose outcome is unknown, kept through rebuilds (WithUnsettled)
	UnsettledOverflows uint64      // unknown outcomes beyond WithUnsettled's max: rebuilds then pass through for a while
	Rebuilding         bool        // a rebuild is running
	Rebuilds           uint64      // rebuilds swapped in
	RebuildErrors      uint64      // rebuilds that failed
	TokenLookups       uint64      // lookups that carried a token (WithToken)
	TokenWaits         uint64      // of those, lookups that waited for the stream to reach their token
	TokenPassed        uint64      // of those, lookups passed through because the stream had not reached their token within WithTokenWait
	TokenForeign       uint64      // lookups passed through because their token was of another stream
	Guard              guard.Stats // the current guard
}

// Stats returns the Loader's statistics.
//
// ObservedFPR is the share of lookups of absent keys that the guard could
// not rule out, among those the Loader saw. Lookups that never reach the
// Loader, such as the requests that HTTP middleware in front of it
// rejected on its own (middleware.Stats.Rejected, which asks
// [Loader.MayContain]), are not in it: add them to Avoided for the guard's
// rate over both paths, as the README's alert does.
func (l *Loader[K, V]) Stats() Stats {
	v := l.cur.Load()
	st := Stats{
		Ready:              l.ready.ready(),
		StoreCalls:         uint64(l.storeCalls.Value()),
		BatchCalls:         uint64(l.batchCalls.Value()),
		Avoided:            uint64(l.avoided.Value()),
		LetThrough:         uint64(l.letThrough.Value()),
		FalsePositives:     uint64(l.falsePos.Value()),
		NegativeCacheHits:  uint64(l.negHits.Value()),
		PassedThrough:      uint64(l.passed.Value()),
		Unsettled:          l.unsettled.len(),
		UnsettledOverflows: l.unsettled.overflows.Load(),
		Rebuilding:         l.rebuilding.Load(),
		Rebuilds:           uint64(l.rebuilds.Value()),
		RebuildErrors:      uint64(l.rebuildErrs.Value()),
		TokenLookups:       uint64(l.tokenLookups.Value()),
		TokenWaits:         uint64(l.tokenWaits.Value()),
		TokenPassed:        uint64(l.tokenPassed.Value()),
		TokenForeign:       uint64(l.tokenForeign.Value()),
		Guard:              v.g.Stats(),
	}
	for i := range v.pass {
		if v.pass[i].Load() {
			st.PassThroughShards++
		}
	}
	if fp := st.FalsePositives + st.NegativeCacheHits; fp+st.Avoided > 0 {
		st.ObservedFPR = float64(fp) / float64(fp+st.Avoided)
	}
	return st
}
