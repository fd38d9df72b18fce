package shard

import (
	"sync/atomic"
	"unsafe"
)

// Layout constants. See the package documentation for how they combine.
const (
	// FingerprintBits is the width F of the stable fingerprint.
	FingerprintBits = 8
	// InitialTailBits is T0, the number of tail bits of a new shard: F+T0 = 16,
	// the slot width. It is also the number of times a shard can double.
	InitialTailBits = 8
	// VirtualBits is the number of low bits of the virtual index that a shard
	// uses. k+T never exceeds it.
	VirtualBits = 32
	// MaxLog2Buckets is the largest k accepted by [New]: a new shard needs
	// k+T0 <= VirtualBits.
	MaxLog2Buckets = VirtualBits - InitialTailBits
	// MaxKicks bounds the eviction walk of one insert (the paper's bound).
	MaxKicks = 500
	// StashSize is the number of homeless slots a shard can park when an
	// eviction walk fails. Lookups check the stash when it is not empty.
	StashSize = 4
)

// alt returns G(f), the XOR distance between an item's two virtual indexes:
// the fmix64 finalizer of MurmurHash3 applied to f, from a table. The | 1
// keeps the two candidate buckets distinct at every table size; it must not
// depend on k, or splits would break the XOR relation.
func alt(f uint8) uint64 {
	return altTable[f]
}

// altTable holds G(f) = fmix64(f) | 1 for every byte f. A lookup that
// misses the cache is bound by how many lookups the CPU overlaps, which
// depends on how many instructions each takes: one L1 load here replaces
// ten arithmetic instructions (measured at 16M keys: see the commit that
// introduced it).
var altTable = func() (t [256]uint64) {
	for f := range t {
		h := uint64(f) // fmix64 starts with h ^= h>>33, a no-op for h < 2^33
		h *= 0xff51afd7ed558ccd
		h ^= h >> 33
		h *= 0xc4ceb9fe1a85ec53
		h ^= h >> 33
		t[f] = h | 1
	}
	return t
}()

// table is one generation of a shard's buckets. Its size and tail width
// never change; a doubling builds a new table and swaps it in.
type table struct {
	buckets []uint64 // read with atomic loads, written with atomic stores under Shard.mu
	kmask   uint64   // len(buckets) - 1
	vmask   uint64   // 1<<(k+t) - 1
	tmask   uint64   // 1<<t - 1
	k       uint8    // log2(len(buckets))
	t       uint8    // tail bits T

	// stashN counts the nonzero entries of stash, so that lookups skip the
	// stash with one load when it is empty (almost always).
	stashN atomic.Int32
	// stash holds homeless slots packed as bucket<<16 | slot; 0 is empty.
	// Entries never move between indexes, so clearing one needs no seqlock
	// bump.
	stash [StashSize]atomic.Uint64

	// Migration. While the shard doubles, next is the table being filled
	// and buckets [0, cursor) of this table have been split into it; a
	// lookup resolves each of its buckets through the cursor. Both are set
	// under Shard.mu and read by lookups under the seqlock.
	next   atomic.Pointer[table]
	cursor atomic.Uint64
}

func newTable(k, t uint8) *table {
	n := uint64(1) << k
	return &table{
		buckets: make([]uint64, n),
		kmask:   n - 1,
		vmask:   1<<(uint(k)+uint(t)) - 1,
		tmask:   1<<t - 1,
		k:       k,
		t:       t,
	}
}

// tableHeaderBytes is the memory of a table besides its buckets.
const tableHeaderBytes = int(unsafe.Sizeof(table{}))

// candidates returns the two (bucket, slot) pairs of an item in t. The
// shift counts are masked to 63 (they are at most 32) so that the compiler
// drops its guard for shifts of 64 or more.
func (t *table) candidates(f uint8, v, g uint64) (b1, s1, b2, s2 uint64) {
	v1 := v & t.vmask
	v2 := v1 ^ g&t.vmask
	hi := uint64(f) << (t.t & 63)
	return v1 & t.kmask, hi | v1>>(t.k&63), v2 & t.kmask, hi | v2>>(t.k&63)
}

// load atomically reads bucket b of t, without a bounds check: every
// bucket index is masked with t.kmask = len(t.buckets)-1, so it is in
// range by construction.
func (t *table) load(b uint64) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(t.buckets)), b*8)))
}

// candidate returns where virtual index vc (already masked to k+t bits)
// of fingerprint f lives in t: its bucket and slot value.
func (t *table) candidate(f uint8, vc uint64) (uint64, uint64) {
	return vc & t.kmask, uint64(f)<<t.t | vc>>t.k
}

// resolve returns the table, bucket and slot where virtual index vc of
// fingerprint f lives now: in t if its bucket has not been split into
// nt = t.next yet (or t is not migrating), else in nt.
func (t *table) resolve(nt *table, cursor uint64, f uint8, vc uint64) (*table, uint64, uint64) {
	if nt != nil && vc&t.kmask < cursor {
		b, s := nt.candidate(f, vc)
		return nt, b, s
	}
	b, s := t.candidate(f, vc)
	return t, b, s
}

// lookup reports whether the item with fingerprint f, virtual index v and
// XOR distance g is in t, resolving buckets through the migration cursor.
// It reads with atomic loads only; the caller validates a miss with the
// shard's seqlock.
func (t *table) lookup(f uint8, v, g uint64) bool {
	nt := t.next.Load()
	if nt == nil {
		b1, s1, b2, s2 := t.candidates(f, v, g)
		return t.contains(b1, s1, b2, s2)
	}
	cur := t.cursor.Load()
	v1 := v & t.vmask
	v2 := v1 ^ g&t.vmask
	tb1, b1, s1 := t.resolve(nt, cur, f, v1)
	tb2, b2, s2 := t.resolve(nt, cur, f, v2)
	if hasSlot(atomic.LoadUint64(&tb1.buckets[b1]), s1) || hasSlot(atomic.LoadUint64(&tb2.buckets[b2]), s2) {
		return true
	}
	// Each table's stash holds entries in that table's coordinates.
	if t.stashN.Load() != 0 {
		o1, os1 := t.candidate(f, v1)
		o2, os2 := t.candidate(f, v2)
		if t.stashContains(o1, os1, o2, os2) {
			return true
		}
	}
	if nt.stashN.Load() != 0 {
		n1, ns1 := nt.candidate(f, v1)
		n2, ns2 := nt.candidate(f, v2)
		if nt.stashContains(n1, ns1, n2, ns2) {
			return true
		}
	}
	return false
}

// other returns the alternate (bucket, slot) of slot s stored in bucket b.
// The XOR covers the tail bits too.
func (t *table) other(b, s uint64) (uint64, uint64) {
	f := s >> t.t
	v := b | (s&t.tmask)<<t.k
	v ^= alt(uint8(f)) & t.vmask
	return v & t.kmask, f<<t.t | v>>t.k
}

// contains reports whether slot s1 is in bucket b1, s2 in b2, or either pair
// in the stash. It reads t with atomic loads only.
func (t *table) contains(b1, s1, b2, s2 uint64) bool {
	x1 := t.load(b1) ^ s1*lanesLow
	x2 := t.load(b2) ^ s2*lanesLow
	return zeroLanes(x1)|zeroLanes(x2) != 0 || t.stashN.Load() != 0 && t.stashContains(b1, s1, b2, s2)
}

// stashContains reports whether the stash holds slot s1 of bucket b1 or s2
// of bucket b2.
func (t *table) stashContains(b1, s1, b2, s2 uint64) bool {
	return t.stashIndex(b1<<laneBits|s1, b2<<laneBits|s2) >= 0
}

// stashIndex returns the index of a stash entry equal to e1 or e2, or -1.
func (t *table) stashIndex(e1, e2 uint64) int {
	for i := range t.stash {
		if e := t.stash[i].Load(); e != 0 && (e == e1 || e == e2) {
			return i
		}
	}
	return -1
}

// put stores slot s in a free lane of bucket b and reports whether there
// was one. The caller holds the shard's mutex.
func (t *table) put(b, s uint64) bool {
	old := t.buckets[b]
	i := freeLane(old)
	if i < 0 {
		return false
	}
	atomic.StoreUint64(&t.buckets[b], withLane(old, i, s))
	return true
}

// place stores slot s in bucket b or in its alternate bucket and reports
// whether either had a free lane. The caller holds the shard's mutex.
func (t *table) place(b, s uint64) bool {
	if t.put(b, s) {
		return true
	}
	b2, s2 := t.other(b, s)
	return t.put(b2, s2)
}

// stashPut parks slot s of bucket b in a free stash entry and reports
// whether there was one. The caller holds the shard's mutex.
func (t *table) stashPut(b, s uint64) bool {
	for i := range t.stash {
		if t.stash[i].Load() == 0 {
			t.stash[i].Store(b<<laneBits | s)
			t.stashN.Add(1)
			return true
		}
	}
	return false
}

// stashClear empties stash entry i. The caller holds the shard's mutex.
func (t *table) stashClear(i int) {
	t.stash[i].Store(0)
	t.stashN.Add(-1)
}

// splitBucket splits bucket b of a table with t tail bits (t >= 1) into the
// buckets j and j+2^k of a table with t-1 tail bits, where j is b's index.
// A slot goes to the upper bucket iff the lowest bit of its tail is set; its
// fingerprint is kept and its tail shifted right by one. Each new bucket is
// fed by this one old bucket only, so a split never overflows.
func splitBucket(b uint64, t uint8) (lo, hi uint64) {
	tmask := uint64(1)<<t - 1
	nlo, nhi := 0, 0
	for i := range slotsPerBucket {
		s := laneOf(b, i)
		if s == 0 {
			continue
		}
		ns := (s>>t)<<(t-1) | (s&tmask)>>1
		if s&1 == 0 {
			lo = withLane(lo, nlo, ns)
			nlo++
		} else {
			hi = withLane(hi, nhi, ns)
			nhi++
		}
	}
	return lo, hi
}

// splitSlot returns where slot s of bucket b of a table with k bucket bits
// and t tail bits lives after a split.
func splitSlot(b, s uint64, k, t uint8) (uint64, uint64) {
	tmask := uint64(1)<<t - 1
	return b | (s&1)<<k, (s>>t)<<(t-1) | (s&tmask)>>1
}

// storeBucket atomically sets bucket b of t to x.
func storeBucket(t *table, b, x uint64) {
	atomic.StoreUint64(&t.buckets[b], x)
}
