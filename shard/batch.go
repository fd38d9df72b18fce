package shard

import "unsafe"

// A lookup in a large table waits for memory twice, once per bucket, and a
// loop of lookups overlaps only the few that fit in the CPU's reorder
// window, which a load that misses holds until its line arrives. A batch
// lookup is a pipeline: each item's buckets, probes and stripe version are
// computed when it is queued, its buckets are prefetched (prefetch_asm.go:
// the request retires at once) in steps of batchStep items, and the item
// is compared BatchGroup items later, when its lines have arrived: loads,
// compares, validation. Meanwhile the caller hashes and routes the keys
// that follow, so that the work overlaps the misses.
//
// Measured at 16M keys on a 2-vCPU Xeon (the README's batch paragraph has
// the commands): one Contains per key 95 ns; the earlier batch, which
// loaded a group's buckets and then ran Contains on each item, 50 ns;
// computing all items first, loading them in a tight loop, then comparing,
// 50 ns as well; the compares without a branch on the hit (half the items
// hit, so that branch is a coin toss, and a wrong guess throws away the
// loads behind it), 43 ns; the pipeline in groups of 16 (all 32 lines of a
// group prefetched at once, the group before compared), 33 ns. On a later
// day on that VM (one Contains 59–80 ns), old and new alternated in one
// run: groups of 16 28.2 ns; prefetches in steps of 4 compared 24 items
// later 24.5 ns (−13%; at 100M keys 40.0 → 35.5 ns, −11%). A burst of 32
// prefetches outruns the CPU's dozen or so line fill buffers and stalls
// the work behind it; steps of 4 spread them over the work. Steps of 2
// cost more calls (26.4 ns), steps of 8 were no better than 16 (27.7);
// distances 16, 32 and 48 were within 1 ns of 24 at 16M, 32 1 ns slower at
// 100M; PREFETCHT0 instead of T1 0.7 ns faster at 16M, 1.9 ns slower at
// 100M.
//
// The first bucket settles a lookup only when it holds the item: 78% of
// present keys are in their first bucket (at 1M and 16M), so a half-present
// batch could skip 39% of its second buckets, at the price of a second
// round of misses for the others; an absent key needs both. Built and
// measured as a second stage (the second bucket prefetched after the first
// missed, compared another BatchGroup items later): 16M 28.1 against
// 25.9 ns, 100M 36.4 against 35.3 ns, so not kept. At 100M a batch costs
// less than two independent misses of the machine's floor (2 × 19.5 ns
// there).

// BatchGroup is how many items a [Batch] runs ahead: an item's buckets
// are prefetched when it is queued (in steps of batchStep items), and
// compared BatchGroup items later, by which time its lines have arrived:
// far enough ahead to cover a miss's latency with the work of the items
// between, near enough that the lines are still in L2 when compared.
const BatchGroup = 24

// batchStep is how many items one call of prefetch requests: the call's
// cost spread over a few items, the requests spread over the work.
const batchStep = 4

// batchRing is the number of items a Batch holds: those queued and not
// yet answered, at most BatchGroup+batchStep. A power of two and a
// multiple of batchStep.
const batchRing = 32

// Batch looks up many items with their cache misses overlapped: after
// [Batch.Start], each [Batch.Add] queues one item, and the answers, those
// of [Shard.Contains], land in the slice given to Start, in the order of
// the Adds, by the time [Batch.Finish] returns (most of them before, as
// the items go through). It takes no lock and does not allocate.
//
// A Batch is about 2.4 KiB, meant for one batch at a time on the caller's
// stack. It is not safe for concurrent use.
type Batch struct {
	// The items queued and not yet answered, in a ring: item j is at
	// index j % batchRing.
	items [batchRing]batchItem
	// addrs are the buckets of the items queued since the last flush,
	// to prefetch.
	addrs [2 * batchStep]unsafe.Pointer

	out      []bool // where the answers go
	queued   int    // items queued since Start
	prepared int    // items whose buckets were prefetched: a multiple of batchStep, or queued
	answered int    // items finished
}

// batchItem is what a batch lookup keeps of one item between queueing
// and answering it.
type batchItem struct {
	s      *Shard // the item's shard
	t      *table // the table read
	v      uint64 // the item's position
	b1, b2 uint64 // its buckets in t
	p1, p2 uint64 // their probes
	ver    uint64 // the stripe version of b1, read before the buckets
	f      uint8  // the item's fingerprint
}

// Start begins a batch whose answers go to out: out[i] for the i-th Add.
// A Batch can be started again once finished.
func (b *Batch) Start(out []bool) {
	b.out, b.queued, b.prepared, b.answered = out, 0, 0, 0
}

// Add queues a lookup of the item with fingerprint f and position v in s,
// whose answer goes to the next index of the slice given to Start. Past
// its end, Add (at the latest batchStep-1 Adds later) or Finish panics, as
// an index out of range would, before it writes any answer.
func (b *Batch) Add(s *Shard, f uint8, v uint64) {
	j := uint(b.queued)
	it := &b.items[j&(batchRing-1)]
	t := s.tab.Load()
	it.b1, it.p1, it.b2, it.p2 = t.probes(f, v, alt(f))
	it.ver = s.vers[stripeOf(it.b1)].Load()
	it.s, it.v, it.f, it.t = s, v, f, t
	a := b.addrs[2*(j&(batchStep-1)):]
	a[0], a[1] = t.addr(it.b1), t.addr(it.b2)
	if b.queued++; b.queued&(batchStep-1) == 0 {
		b.flush()
	}
}

// flush prefetches the buckets of the items queued since the last flush
// (a step, or the last ones), then finishes those that are BatchGroup
// items behind.
func (b *Batch) flush() {
	_ = b.out[b.queued-1] // Add's panic, before any answer is written
	n := b.queued - b.prepared
	prefetch(&b.addrs[0], 2*n)
	b.prepared = b.queued
	b.finishTo(b.prepared - BatchGroup)
}

// Finish answers every item queued and ends the batch.
func (b *Batch) Finish() {
	if b.prepared < b.queued {
		b.flush()
	}
	b.finishTo(b.prepared)
}

// finishTo finishes the items up to hi, in runs that do not wrap around
// the ring.
func (b *Batch) finishTo(hi int) {
	for b.answered < hi {
		lo := b.answered
		end := min(hi, lo+batchRing-lo&(batchRing-1))
		b.finish(lo, end)
		b.answered = end
	}
}

// finish looks up the prefetched items [lo, hi), which do not wrap around
// the ring, into out[lo:hi], as [Shard.Contains] does from its loads of
// the buckets on.
func (b *Batch) finish(lo, hi int) {
	r := uint(lo) & (batchRing - 1)
	n := min(uint(hi-lo), batchRing-r)
	items := b.items[r : r+n]
	out := b.out[lo : lo+int(n)]
	for i := range items {
		it := &items[i]
		s, t := it.s, it.t
		// The compare of Contains (see there, and matches).
		w1, w2 := t.load(it.b1), t.load(it.b2)
		var x1, x2 uint64
		if t.exact {
			x1, x2 = w1^(it.p1|lanesLow), w2^(it.p2|lanesLow)
		} else {
			l1, l2 := w1&lowBytes|stoppers, w2&lowBytes|stoppers
			x1 = (w1 ^ it.p1) &^ ((l1 ^ (l1 - lanesLow)) & lowBytes)
			x2 = (w2 ^ it.p2) &^ ((l2 ^ (l2 - lanesLow)) & lowBytes)
		}
		hit := zeroLanes(x1)|zeroLanes(x2) != 0
		out[i] = hit
		// A miss is trusted only if no entry moved through the buckets
		// while they were read (see Contains). The check runs for hits
		// too, and first, so that the one branch the CPU must guess is
		// one it guesses right: whether hit is true is a coin toss in a
		// batch of present and absent keys.
		clean := t.stashN.Load() == 0 && t.next.Load() == nil && s.vers.stable(stripeOf(it.b1), it.ver)
		if !clean && !hit {
			out[i] = s.containsSlow(it.f, it.v)
		}
	}
}

// ContainsMany sets out[i] to whether the item with fingerprint fs[i] and
// position vs[i] might be in shards[i], as [Shard.Contains] would, for
// every i < len(shards), through a [Batch]. fs, vs and out must be at
// least as long as shards. It takes no lock and does not allocate.
func ContainsMany(shards []*Shard, fs []uint8, vs []uint64, out []bool) {
	n := len(shards)
	fs, vs, out = fs[:n], vs[:n], out[:n] // one bounds check for all
	var b Batch
	b.Start(out)
	for i, s := range shards {
		b.Add(s, fs[i], vs[i])
	}
	b.Finish()
}

// The ring holds every item queued and not answered (a compile-time check).
var _ [batchRing - BatchGroup - batchStep]struct{}
