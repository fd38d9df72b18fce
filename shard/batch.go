package shard

import "unsafe"

// A lookup in a large table waits for memory twice, once per bucket, and a
// loop of lookups overlaps only the few that fit in the CPU's reorder
// window, which a load that misses holds until its line arrives. A batch
// lookup runs as a pipeline over groups of BatchGroup items. When a group
// is complete, it computes each item's buckets, probes and stripe version
// and prefetches the buckets (prefetch_asm.go: the request retires at
// once); then it finishes the group before, whose lines have arrived
// meanwhile: loads, compares, validation. While the new group's lines
// travel, the caller hashes and routes the keys of the next one.
//
// Measured at 16M keys on a 2-vCPU Xeon (the README's batch paragraph has
// the commands): one Contains per key 95 ns; the earlier batch, which
// loaded a group's buckets and then ran Contains on each item, 50 ns;
// computing all items first, loading them in a tight loop, then comparing,
// 50 ns as well; the compares without a branch on the hit (half the items
// hit, so that branch is a coin toss, and a wrong guess throws away the
// loads behind it), 43 ns; the pipeline with prefetches, 33 ns. At 100M
// keys a batch costs about the sum of its work in cache (19 ns per key at
// 1M) and two independent misses of the machine's floor (2 × 14–17 ns):
// the misses overlap each other, and the work only in part.
//
// The first bucket settles a lookup only when it holds the item: 78% of
// present keys are in their first bucket (at 1M and 16M), so a half-present
// batch could skip 39% of its second buckets, at the price of a second
// round of misses for the others; an absent key needs both.

// BatchGroup is the number of items a [Batch] prefetches at once, and so
// how far its prefetches run ahead of its compares: enough misses in
// flight to use the memory system's parallelism, few enough that a burst
// of prefetches does not wait for the CPU's line fill buffers (a dozen or
// two), and a distance of a few hundred nanoseconds of work, past a
// miss's latency. Measured on the 2-vCPU Xeon, ns per key in half-present
// batches of 1000 (four runs each, alternated): 8 items 31.9 at 16M keys
// and 45.2 at 100M, 16 items 32.3 and 45.0, 32 items 37.0 and 52.2, 64
// items 34.8 and 50.7. 8 runs ahead by only about 250 ns.
const BatchGroup = 16

// Batch looks up many items with their cache misses overlapped: after
// [Batch.Start], each [Batch.Add] queues one item, and the answers, those
// of [Shard.Contains], land in the slice given to Start, in the order of
// the Adds, by the time [Batch.Finish] returns (most of them before, as
// the groups go through). It takes no lock and does not allocate.
//
// A Batch is about 2.5 KiB, meant for one batch at a time on the caller's
// stack. It is not safe for concurrent use.
type Batch struct {
	// Two groups of items, in a ring: the one being queued, and the one
	// before, prepared and waiting to be finished.
	queue [2 * BatchGroup]batchQuery
	items [2 * BatchGroup]batchItem

	out      []bool // where the answers go
	queued   int    // items queued since Start; item j is at ring index j % (2*BatchGroup)
	prepared int    // items prepared: the groups before the one being queued
	answered int    // items finished
}

// batchQuery is one item as queued.
type batchQuery struct {
	s *Shard
	v uint64
	f uint8
}

// batchItem is what a batch lookup keeps of one item between preparing
// and finishing it.
type batchItem struct {
	t      *table // the table read
	b1, b2 uint64 // the item's buckets in t
	p1, p2 uint64 // their probes
	ver    uint64 // the stripe version of b1, read before the buckets
}

// Start begins a batch whose answers go to out: out[i] for the i-th Add.
// A Batch can be started again once finished.
func (b *Batch) Start(out []bool) {
	b.out, b.queued, b.prepared, b.answered = out, 0, 0, 0
}

// Add queues a lookup of the item with fingerprint f and position v in s,
// whose answer goes to the next index of the slice given to Start. Past
// its end, Add or Finish panics, as an index out of range would.
func (b *Batch) Add(s *Shard, f uint8, v uint64) {
	b.queue[b.queued&(2*BatchGroup-1)] = batchQuery{s, v, f}
	if b.queued++; b.queued&(BatchGroup-1) == 0 {
		b.flush()
	}
}

// flush prepares the group queued last, which is full or the last one,
// then finishes the one before it.
func (b *Batch) flush() {
	_ = b.out[b.queued-1] // Add's panic, before any work
	lo := b.prepared
	b.prepare(lo, b.queued)
	b.prepared = b.queued
	if b.answered < lo {
		b.finish(b.answered, lo)
		b.answered = lo
	}
}

// Finish answers every item queued and ends the batch.
func (b *Batch) Finish() {
	if b.prepared < b.queued {
		b.flush()
	}
	if b.answered < b.prepared {
		b.finish(b.answered, b.prepared)
		b.answered = b.prepared
	}
}

// prepare computes the items [lo, hi) of one group and prefetches their
// buckets. It reads what Contains reads before the buckets, in the same
// order: the table, then the stripe version of the first bucket.
func (b *Batch) prepare(lo, hi int) {
	var addrs [2 * BatchGroup]unsafe.Pointer
	r := uint(lo) % (2 * BatchGroup)
	n := min(uint(hi-lo), BatchGroup)
	queue, items := b.queue[r:r+n], b.items[r:r+n]
	for i, q := range queue {
		s, f, v, it := q.s, q.f, q.v, &items[i]
		t := s.tab.Load()
		it.b1, it.p1, it.b2, it.p2 = t.probes(f, v, alt(f))
		it.ver = s.vers[stripeOf(it.b1)].Load()
		it.t = t
		addrs[2*i], addrs[2*i+1] = t.addr(it.b1), t.addr(it.b2)
	}
	prefetch(&addrs[0], int(2*n))
}

// finish looks up the prepared items [lo, hi) of one group into out[lo:hi],
// as [Shard.Contains] does from its loads of the buckets on.
func (b *Batch) finish(lo, hi int) {
	r := uint(lo) % (2 * BatchGroup)
	n := min(uint(hi-lo), BatchGroup)
	queue, items := b.queue[r:r+n], b.items[r:r+n]
	out := b.out[lo : lo+int(n)]
	for i := range queue {
		s, it := queue[i].s, &items[i]
		t := it.t
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
			out[i] = s.containsSlow(queue[i].f, queue[i].v)
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
