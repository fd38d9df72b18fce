package shard

import (
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/cuckooguard/cuckooguard/internal/memsize"
)

// Layout constants. See the package documentation for how they combine.
const (
	// VirtualBits is the number of position bits an item has: the top
	// VirtualBits bits of the v that callers pass. A table of 2^k buckets
	// uses the first k as the bucket and keeps up to MaxTailBits more in
	// the slot.
	VirtualBits = 40
	// MaxLog2Buckets is the largest k accepted by [New]: entries of a
	// larger table would keep fewer than MaxTailBits tail bits (and on a
	// 32-bit platform the table would not fit in memory).
	MaxLog2Buckets = min(VirtualBits-MaxTailBits, maxTableLog2)
	// maxTableLog2 is the largest table a shard doubles to: every position
	// bit a bucket bit, or as much as the platform can address.
	maxTableLog2 = min(VirtualBits, bits.UintSize-5)
	// StashSize is the number of homeless slots a shard can park when an
	// eviction walk fails. Lookups check the stash when it is not empty.
	StashSize = 4
	// MaxCopies is the number of identical copies of one item that a
	// shard keeps; [Shard.Insert] refuses more with [ErrTooManyCopies].
	MaxCopies = 4
)

// positionMask keeps the VirtualBits position bits of a v.
const positionMask = ^uint64(1<<(64-VirtualBits) - 1)

// alt returns G(f), the XOR distance between an item's two positions: the
// fmix64 finalizer of MurmurHash3 applied to f, over the VirtualBits
// position bits, with the first position bit set so that the two
// candidate buckets differ at every table size. It must not depend on the
// table size, or doublings would break the XOR relation.
func alt(f uint8) uint64 {
	return altTable[f]
}

// altTable holds G(f) for every byte f. A lookup that misses the cache is
// bound by how many lookups the CPU overlaps, which depends on how many
// instructions each takes: one L1 load here replaces ten arithmetic
// instructions.
var altTable = func() (t [256]uint64) {
	for f := range t {
		h := uint64(f) // fmix64 starts with h ^= h>>33, a no-op for h < 2^33
		h *= 0xff51afd7ed558ccd
		h ^= h >> 33
		h *= 0xc4ceb9fe1a85ec53
		h ^= h >> 33
		t[f] = (h | 1<<63) & positionMask
	}
	return t
}()

// table is one generation of a shard's buckets. Its size never changes; a
// doubling builds a new table and swaps it in.
//
// Bucket b holds the entries whose position starts with the k bits of b
// (the most significant first); bucket b of a table of 2^k buckets splits
// into buckets 2b and 2b+1 of the doubled table.
//
// The header is two cache lines: what lookups read, which writers change
// only when entries are stashed or the shard doubles, and what only
// writers use, which a plain insert or delete neither reads nor writes
// (see count): at 16M keys, where table headers fall out of the cache,
// a line that each delete read cost a miss. While the tail histogram shared the lookups' line, every
// write to a shard cost the next lookup of that shard on each other core
// a cache miss (issue 34). A header of two whole lines falls in an
// allocator size class of whole lines, so that its lines are the cache's
// own (TestTableLayout).
type table struct {
	tableLookup
	// The padding goes before tails, not after: a zero-length last field
	// would make the compiler add padding of its own.
	_ [(cacheLine - unsafe.Sizeof(tableLookup{})%cacheLine) % cacheLine]byte

	// tails counts the entries (copies included) with a tail shorter than
	// MaxTailBits by tail length, for the false-positive estimate; the
	// rest of the shard's copies keep MaxTailBits (see histogram), so
	// that the inserts of a table that has room for MaxTailBits count
	// nothing here. Written under Shard.mu.
	tails [MaxTailBits]atomic.Int64
	// refused counts the shard's inserts refused with ErrTooManyCopies,
	// carried over to the next table by a doubling. Written under
	// Shard.mu, here rather than on the shard's write side, which the
	// counts of every insert and delete fill.
	refused atomic.Uint64
}

// tableLookup is the part of a table header that lookups read.
type tableLookup struct {
	buckets []uint64 // read with atomic loads, written with atomic stores under Shard.mu
	k       uint8    // log2(len(buckets))
	sh      uint8    // 64-k: v>>sh is the bucket of position v
	psh     uint8    // 56-k: v>>psh&0xff is the probe byte, the 8 position bits after the bucket
	// exact is set for a table made empty with entries of one tail length
	// only (a new shard's first table): a lookup then compares each lane
	// with one exact slot value, as cheaply as a fixed-width filter. A
	// table made by a doubling holds shorter tails too. Immutable.
	exact bool
	// huge is set for a table whose memory was advised to be backed by
	// huge pages (hugepages.go); the tables its doublings make are
	// advised too. Read and written under Shard.mu only: lookups never
	// read it.
	huge bool

	// stashN is len(*stash), so that lookups skip the stash with one load
	// when it is empty (almost always).
	stashN atomic.Int32
	// stashRoom is the number of stash entries whose memory the table's
	// reservation from the shard's growth policy covers, at least
	// StashSize: the stash grows under no lock of the policy's, so its
	// room is reserved with the table (see reservedBytes). Set before the
	// table is published; immutable.
	stashRoom int32
	// stash holds homeless slots packed as bucket<<laneBits | slot. A
	// writer replaces the slice, never changes one that is published, so
	// a lookup reads a consistent list; removing an entry moves nothing
	// else, so it bumps no stripe. An eviction path parks at most
	// StashSize entries there; a doubling may leave more (see
	// finishLocked).
	stash atomic.Pointer[[]uint64]

	// Migration. While the shard doubles, next is the table being filled
	// and buckets [0, cursor) of this table have been split into it; a
	// lookup resolves each of its buckets through the cursor. Both are set
	// under Shard.mu and read by lookups, which validate with the stripes.
	next   atomic.Pointer[table]
	cursor atomic.Uint64
}

func newTable(k uint8) *table {
	t := newTableHeader(k)
	t.buckets = make([]uint64, 1<<k)
	return t
}

// newTableHeader returns a table of 2^k buckets without its buckets, with
// room for a stash of StashSize entries.
func newTableHeader(k uint8) *table {
	t := new(table)
	t.k, t.sh, t.psh = k, 64-k, 56-k
	t.stashRoom = StashSize
	return t
}

// tnew returns the tail length of entries inserted into t: the longest a
// slot keeps, unless the table uses nearly every position bit.
func (t *table) tnew() int {
	return min(MaxTailBits, VirtualBits-int(t.k))
}

// tableBytes returns the heap memory of a table of n buckets: its header
// and its bucket array, each rounded up to the allocator's size class.
func tableBytes(n int) int {
	return memsize.Of(int(unsafe.Sizeof(table{})), true) + memsize.Of(8*n, false)
}

// reservedBytes returns the memory that t holds under a growth policy's
// cap: its header and buckets, and its stash as large as its room. What
// Stats counts (the stash as it is now) never exceeds it: an eviction
// stashes only below StashSize, and a doubling's new table gets room for
// every entry that the old stash can leave it (see beginGrowLocked).
func (t *table) reservedBytes() int64 {
	return int64(tableBytes(len(t.buckets)) + stashBytes(int(t.stashRoom)))
}

// stashBytes returns the heap memory of a stash of n entries: the slice
// header the stash pointer points to and its array.
func stashBytes(n int) int {
	if n == 0 {
		return 0
	}
	return memsize.Of(int(unsafe.Sizeof([]uint64(nil))), true) + memsize.Of(8*n, false)
}

// load atomically reads bucket b of t, without a bounds check: every
// bucket index is a position shifted right by 64-k, so it is below
// len(t.buckets) by construction.
func (t *table) load(b uint64) uint64 {
	return atomic.LoadUint64((*uint64)(t.addr(b)))
}

// addr returns the address of bucket b of t, without a bounds check (see
// load).
func (t *table) addr(b uint64) unsafe.Pointer {
	return unsafe.Add(unsafe.Pointer(unsafe.SliceData(t.buckets)), b*8)
}

// probes returns the two buckets of an item in t with the probe (see
// probeOf) that each must match. g is alt(f).
func (t *table) probes(f uint8, v, g uint64) (b1, p1, b2, p2 uint64) {
	v2 := v ^ g
	// The shift counts are masked to 63 so that the compiler drops its
	// guard for shifts of 64 or more; they are at most 63.
	return v >> (t.sh & 63), probeOf(f, v>>(t.psh&63)&0xff), v2 >> (t.sh & 63), probeOf(f, v2>>(t.psh&63)&0xff)
}

// slots returns the two buckets of an item in t with the slot a new copy
// of it gets in each.
func (t *table) slots(f uint8, v, g uint64) (b1, s1, b2, s2 uint64) {
	v2 := v ^ g
	tn := t.tnew()
	return v >> t.sh, makeSlot(f, v>>t.psh&0xff, tn), v2 >> t.sh, makeSlot(f, v2>>t.psh&0xff, tn)
}

// candidate returns the bucket of position vc in t, its probe byte, and the
// slot a new copy of fingerprint f gets there.
func (t *table) candidate(f uint8, vc uint64) (b, pb, s uint64) {
	pb = vc >> t.psh & 0xff
	return vc >> t.sh, pb, makeSlot(f, pb, t.tnew())
}

// resolve returns the table where position vc lives now: t if its bucket
// has not been split into nt = t.next yet (or t is not migrating), else nt.
func (t *table) resolve(nt *table, cursor, vc uint64) *table {
	if nt != nil && vc>>t.sh < cursor {
		return nt
	}
	return t
}

// lookup reports whether the item with fingerprint f, position v and XOR
// distance g is in t, resolving buckets through the migration cursor. It
// reads with atomic loads only; the caller validates a miss with the
// shard's stripes.
func (t *table) lookup(f uint8, v, g uint64) bool {
	nt := t.next.Load()
	cur := t.cursor.Load()
	for _, vc := range [2]uint64{v, v ^ g} {
		rt := t.resolve(nt, cur, vc)
		b, pb, _ := rt.candidate(f, vc)
		if matches(rt.load(b), probeOf(f, pb)) {
			return true
		}
	}
	// Each table's stash holds entries in that table's coordinates.
	return t.stashLookup(f, v, g) || nt != nil && nt.stashLookup(f, v, g)
}

// stashLookup reports whether t's stash holds an entry that the item with
// fingerprint f, position v and XOR distance g matches.
func (t *table) stashLookup(f uint8, v, g uint64) bool {
	if t.stashN.Load() == 0 {
		return false
	}
	return t.stashMatch(f, v, g) >= 0
}

// stashEntries returns the stash's entries; the caller must not change
// them.
func (t *table) stashEntries() []uint64 {
	if p := t.stash.Load(); p != nil {
		return *p
	}
	return nil
}

// stashMatch returns the index of the stash entry that the item matches
// with the longest tail, or -1.
func (t *table) stashMatch(f uint8, v, g uint64) int {
	best, bestLen := -1, -1
	entries := t.stashEntries()
	for _, vc := range [2]uint64{v, v ^ g} {
		b, pb, _ := t.candidate(f, vc)
		for i, e := range entries {
			if e>>laneBits != b {
				continue
			}
			if s := e & laneMask; slotMatches(s, f, pb) && tailLen(s) > bestLen {
				best, bestLen = i, tailLen(s)
			}
		}
	}
	return best
}

// other returns the alternate bucket and slot of slot s stored in bucket b:
// the entry knows the first k+t bits of its position (the bucket, then its
// tail), and the XOR with G covers all of them.
func (t *table) other(b, s uint64) (uint64, uint64) {
	f := uint8(s >> 8)
	tl := uint(tailLen(s))
	pos := b<<tl | s&0xff>>(8-tl) // the k+tl known bits
	pos ^= alt(f) >> (64 - uint(t.k) - tl)
	term := uint64(1) << (MaxTailBits - tl)
	return pos >> tl, uint64(f)<<8 | (pos&(1<<tl-1))<<(8-tl) | term
}

// put stores slot s in a free lane of bucket b and reports whether there
// was one. It writes with compare-and-swap: lock-free writers may change
// the bucket meanwhile.
func (t *table) put(b, s uint64) bool {
	for {
		old := t.load(b)
		i := freeLane(old)
		if i < 0 {
			return false
		}
		if t.cas(b, old, withLane(old, i, s)) {
			return true
		}
	}
}

// cas sets bucket b of t to nw if it holds old, and reports whether it
// did.
func (t *table) cas(b, old, nw uint64) bool {
	return atomic.CompareAndSwapUint64((*uint64)(t.addr(b)), old, nw)
}

// removeSlot clears one lane of bucket b that holds slot s, and reports
// whether there was one.
func (t *table) removeSlot(b, s uint64) bool {
	for {
		w := t.load(b)
		m := exactZeroLanes(w ^ s*lanesLow)
		if m == 0 {
			return false
		}
		i := bits.TrailingZeros64(m) / laneBits
		if t.cas(b, w, withLane(w, i, 0)) {
			return true
		}
	}
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

// stashAdd parks slot s of bucket b in the stash whatever its length. The
// caller holds the shard's mutex.
func (t *table) stashAdd(b, s uint64) {
	old := t.stashEntries()
	entries := append(make([]uint64, 0, len(old)+1), old...)
	entries = append(entries, b<<laneBits|s)
	t.stash.Store(&entries)
	t.stashN.Store(int32(len(entries)))
}

// stashRemove removes stash entry i. The caller holds the shard's mutex.
func (t *table) stashRemove(i int) {
	old := t.stashEntries()
	entries := make([]uint64, 0, len(old)-1)
	entries = append(append(entries, old[:i]...), old[i+1:]...)
	t.stash.Store(&entries)
	t.stashN.Store(int32(len(entries)))
}

// stashEqual returns the number of stash entries equal to slot s of
// bucket b.
func (t *table) stashEqual(b, s uint64) int {
	n := 0
	for _, e := range t.stashEntries() {
		if e == b<<laneBits|s {
			n++
		}
	}
	return n
}

// count adds n entries of slot s to the tail histogram. Entries with
// MaxTailBits, all those a table inserts while it has room for them, are
// not counted but derived (see histogram): their inserts and deletes
// write no line of the header. The caller holds the shard's mutex.
func (t *table) count(s uint64, n int64) {
	if tl := tailLen(s); tl < MaxTailBits {
		t.tails[tl].Add(n)
	}
}

// histogram returns the entries of t by tail length, given copies, the
// shard's count of them: the counted short tails, and the rest with
// MaxTailBits. (While the shard doubles, copies counts both tables'
// entries and the result is an estimate.)
func (t *table) histogram(copies int) (h [MaxTailBits + 1]int) {
	short := 0
	for i := range t.tails {
		h[i] = int(t.tails[i].Load())
		short += h[i]
	}
	h[MaxTailBits] = max(copies-short, 0)
	return h
}

// splitBucket splits bucket w of a table into the buckets lo = 2j and
// hi = 2j+1 of the doubled table, where j is w's index: each entry moves
// to the child its tail's first bit picks and loses that bit; a void entry
// (no tail left) goes to both. Each child is fed by this one bucket, and a
// bucket with v void and n other entries (v+n ≤ 4) gives each child at most
// v+n, so a split never overflows. It returns the number of void entries,
// which the split duplicated, and adds the children's entries to the
// histogram hist.
func splitBucket(w uint64, hist *[MaxTailBits + 1]int64) (lo, hi uint64, voids int) {
	nlo, nhi := 0, 0
	for i := range slotsPerBucket {
		s := laneOf(w, i)
		if s == 0 {
			continue
		}
		ns, bit, ok := splitSlot(s)
		if !ok {
			lo = withLane(lo, nlo, ns)
			hi = withLane(hi, nhi, ns)
			nlo++
			nhi++
			voids++
			hist[0] += 2
			continue
		}
		if bit == 0 {
			lo = withLane(lo, nlo, ns)
			nlo++
		} else {
			hi = withLane(hi, nhi, ns)
			nhi++
		}
		hist[tailLen(ns)]++
	}
	return lo, hi, voids
}

// storeBucket atomically sets bucket b of t to x.
func storeBucket(t *table, b, x uint64) {
	atomic.StoreUint64(&t.buckets[b], x)
}
