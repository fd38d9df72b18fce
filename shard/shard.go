package shard

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Shard is one cuckoo filter table. Use [New] to make one; the zero Shard
// is not usable.
//
// Shard is safe for concurrent use by multiple goroutines: writers serialize
// on an internal mutex and lookups take no lock. A Shard must not be copied
// after first use.
type Shard struct {
	// Read side: everything a lookup touches, in one cache line. The
	// versions (8-byte aligned) go first, so that no alignment gap opens
	// before them on 32-bit platforms, where the pointer takes 4 bytes.
	vers versions              // striped versions: odd while entries move (see seqlock.go)
	tab  atomic.Pointer[table] // current table; replaced by a doubling
	_    [cacheLine - unsafe.Sizeof(versions{}) - unsafe.Sizeof(uintptr(0))]byte

	// Write side, kept off the readers' cache line so that plain inserts and
	// deletes do not invalidate it. The padding goes before it: a
	// zero-length last field would make the compiler add padding of its own.
	_ [(cacheLine - unsafe.Sizeof(writeSide{})%cacheLine) % cacheLine]byte
	writeSide
}

const cacheLine = 64

// writeSide is everything an insert or a delete writes besides buckets,
// on the line that Lock takes anyway: the counts a guard needs for its
// adds and removes too, so that a write moves no other line between the
// cores of the writers (issue 34).
type writeSide struct {
	mu sync.Mutex // protects the fields below and writes to *tab
	// inserts and deletes count the items inserted (ReadFrom's included)
	// and deleted; the shard holds inserts - deletes. Both only grow, so
	// that sums of them over shards do too. Written under mu.
	inserts   atomic.Uint64
	deletes   atomic.Uint64
	copies    atomic.Int64 // occupied slots, stash included; written under mu
	doublings atomic.Int32 // written under mu
	// searches counts the searches for an eviction path, for tests: a
	// failed search moves nothing and bumps no version. (An int32 beside
	// doublings keeps writeSide in one cache line.)
	searches int32
	retries  atomic.Uint64
	// fullAt is the item count at which a search for an eviction path
	// last failed, 0 if none has since the last delete or doubling. An
	// insert that would need one at that count or above fails at once:
	// writers retrying on a full shard would otherwise search it, up to
	// maxPathNodes bucket reads each, again and again.
	fullAt int64
	// growth is the shard's growth policy, nil for a shard that doubles
	// only when told to; set once by SetGrowth before the shard is shared.
	growth *Growth
}

// New returns an empty shard with 2^log2Buckets buckets of four slots.
// log2Buckets must be in [1, MaxLog2Buckets]; a shard of 2^k buckets takes
// 2^(k+3) bytes.
func New(log2Buckets int) (*Shard, error) {
	s := new(Shard)
	if err := s.Init(log2Buckets); err != nil {
		return nil, err
	}
	return s, nil
}

// Init makes s an empty shard as [New] does, for shards kept by value in a
// slice. Init must be called before any other method and only once.
func (s *Shard) Init(log2Buckets int) error {
	if log2Buckets < 1 || log2Buckets > MaxLog2Buckets {
		return fmt.Errorf("shard: log2 of bucket count %d out of range [1, %d]", log2Buckets, MaxLog2Buckets)
	}
	t := newTable(uint8(log2Buckets))
	t.exact = t.tnew() == MaxTailBits
	s.tab.Store(t)
	return nil
}

// Contains reports whether the item with fingerprint f and position v
// might be in the shard. If true, the result might be a false positive. If
// false, the item is definitely not in the shard: no insert of it completed
// before the call began without a delete after it.
//
// Contains takes no lock and does not allocate.
func (s *Shard) Contains(f uint8, v uint64) bool {
	// The fast path reads the current table's two buckets and nothing
	// else; the stash, a migration in progress and a retry after a
	// concurrent move go to containsSlow. Lookups that miss the cache are
	// bound by how many the CPU overlaps, so instructions here count.
	t := s.tab.Load()
	g := alt(f)
	b1, p1, b2, p2 := t.probes(f, v, g)
	st := stripeOf(b1)
	ver := s.vers[st].Load()
	// Both buckets are loaded and matched before one branch: the loads
	// overlap, and a hit in either bucket costs no misprediction. A hit
	// is never wrong, whatever writers are doing (a table being split
	// still holds every item it held). See matches for the expression.
	w1, w2 := t.load(b1), t.load(b2)
	var x1, x2 uint64
	if t.exact {
		// Every entry keeps 7 tail bits: the slot is the probe with its
		// last bit (the terminator) set.
		x1, x2 = w1^(p1|lanesLow), w2^(p2|lanesLow)
	} else {
		l1, l2 := w1&lowBytes|stoppers, w2&lowBytes|stoppers
		x1 = (w1 ^ p1) &^ ((l1 ^ (l1 - lanesLow)) & lowBytes)
		x2 = (w2 ^ p2) &^ ((l2 ^ (l2 - lanesLow)) & lowBytes)
	}
	if zeroLanes(x1)|zeroLanes(x2) != 0 {
		return true
	}
	// A miss is trusted only if no entry moved through our buckets while
	// we read: otherwise we might have read bucket b1 before the item
	// moved into it and b2 after it left (see seqlock.go).
	if t.stashN.Load() == 0 && t.next.Load() == nil && s.vers.stable(st, ver) {
		return false
	}
	return s.containsSlow(f, v)
}

// containsSlow is Contains for a shard with a stash or a doubling in
// progress, or after a miss that overlapped a writer's move.
func (s *Shard) containsSlow(f uint8, v uint64) bool {
	g := alt(f)
	for try := 0; ; try++ {
		if try > 0 {
			s.retries.Add(1)
			if try >= 16 {
				runtime.Gosched() // let the writer finish its moves
			}
		}
		// The stripe of the first bucket in the table loaded here: a doubling
		// moves stash entries under every stripe, so during a migration
		// any consistent choice of stripe works.
		t := s.tab.Load()
		st := stripeOf(v >> t.sh)
		ver := s.vers[st].Load()
		if t.lookup(f, v, g) {
			return true
		}
		if s.vers.stable(st, ver) {
			return false
		}
	}
}

// Insert adds one copy of the item with fingerprint f (which must not be 0)
// and position v (its top [VirtualBits] bits). It returns an error wrapping
// [ErrFull] if the item cannot be placed and [ErrTooManyCopies] if the
// shard holds [MaxCopies] identical copies of it already; the shard is
// then unchanged. A shard with a growth policy ([Shard.SetGrowth]) that
// has no room for the item doubles first, in the caller's goroutine
// (releasing its mutex between chunks), and returns ErrFull only if the
// policy refuses the doubling.
func (s *Shard) Insert(f uint8, v uint64) error {
	if f == 0 {
		return ErrZeroFingerprint
	}
	for {
		d, err := s.insert(f, v)
		if err != ErrFull || s.growth == nil {
			return err
		}
		// No room even after an eviction walk (a migrating shard finishes
		// its doubling before it walks): double, and retry. A doubled
		// shard is about half full, so a second failure is a crowd, which
		// growFor refuses: the loop runs at most twice.
		if err := s.growFor(d); err != nil {
			return err
		}
	}
}

// insert is one attempt of Insert, under the mutex. It also returns the
// shard's doublings at the attempt, for growFor. (It reads them under the
// mutex: read before Lock, they would fetch the writers' cache line from
// the core that wrote it last, and Lock would then have to take it back
// from that core's copy, two transfers instead of one.)
func (s *Shard) insert(f uint8, v uint64) (doublings int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	doublings = s.Doublings()
	t := s.tab.Load()
	g := alt(f)
	if nt := t.next.Load(); nt != nil {
		// Migrating: a free slot in either resolved bucket is enough.
		cur := t.cursor.Load()
		var tabs [2]*table
		var bs, ss [2]uint64
		n := 0
		for i, vc := range [2]uint64{v, v ^ g} {
			tabs[i] = t.resolve(nt, cur, vc)
			bs[i], _, ss[i] = tabs[i].candidate(f, vc)
			n += equalLanes(tabs[i].buckets[bs[i]], ss[i]) + tabs[i].stashEqual(bs[i], ss[i])
		}
		if n >= MaxCopies {
			t.refused.Add(1)
			return doublings, ErrTooManyCopies
		}
		for i := range tabs {
			if tabs[i].put(bs[i], ss[i]) {
				s.added(tabs[i], ss[i])
				return doublings, nil
			}
		}
		// Evictions would have to cross the cursor: help finish the
		// migration first, then insert into the doubled table.
		s.finishGrowLocked()
		t = s.tab.Load()
	}
	b1, s1, b2, s2 := t.slots(f, v, g)
	if equalLanes(t.buckets[b1], s1)+equalLanes(t.buckets[b2], s2)+t.stashEqual(b1, s1)+t.stashEqual(b2, s2) >= MaxCopies {
		t.refused.Add(1)
		return doublings, ErrTooManyCopies
	}
	if t.put(b1, s1) {
		s.added(t, s1)
		return doublings, nil
	}
	if t.put(b2, s2) {
		s.added(t, s2)
		return doublings, nil
	}
	if s.fullAt != 0 && int64(s.Len()) >= s.fullAt {
		return doublings, ErrFull
	}
	sl, err := s.kickLocked(t, b1, s1, b2, s2, true)
	if err != nil {
		s.fullAt = int64(s.Len())
		return doublings, err
	}
	s.added(t, sl)
	return doublings, nil
}

// added counts a new item whose slot s was stored in t. The caller holds
// s.mu.
func (s *Shard) added(t *table, sl uint64) {
	s.inserts.Add(1)
	s.copies.Add(1)
	t.count(sl, 1)
}

// Delete removes one copy of the item with fingerprint f and position v
// and reports whether there was one. Of the entries the item matches in
// its two buckets and the stash it removes the most specific, the one that
// knows the most position bits (its table's bucket bits and its tail):
// that is safe even if it is another item's entry, because every item that
// matches a more specific entry also matches the less specific one the
// deleted item's own entry keeps (what it knows is a prefix). Deleting an
// item that was never inserted can still remove another item's entry;
// callers delete only what they inserted.
//
// An entry that was void (no tail left) when the shard doubled has copies
// in buckets the item's lookups never visit; Delete removes the one in the
// item's own buckets and leaves the others, which can only cause false
// positives.
func (s *Shard) Delete(f uint8, v uint64) bool {
	if f == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tab.Load()
	g := alt(f)
	nt := t.next.Load()
	cur := t.cursor.Load()
	// The best match: a lane of a resolved bucket, or a stash entry. While
	// the shard doubles, the candidates sit in tables of two sizes, and an
	// entry's specificity is the position bits it knows, its table's k
	// plus its tail: a tail of 7 in the new table knows one bit more than
	// a tail of 7 in the old one. Tails alone are not enough: they could
	// pick the old table's less specific entry of another item and leave
	// this item's own, which that item does not match: a false negative.
	var (
		bestTab  *table
		bestB    uint64
		bestLane = -1
		bestBits = -1
		bestSt   = -1
	)
	for _, vc := range [2]uint64{v, v ^ g} {
		rt := t.resolve(nt, cur, vc)
		b, pb, _ := rt.candidate(f, vc)
		w := rt.buckets[b]
		for i := range slotsPerBucket {
			if sl := laneOf(w, i); slotMatches(sl, f, pb) && int(rt.k)+tailLen(sl) > bestBits {
				bestTab, bestB, bestLane, bestBits, bestSt = rt, b, i, int(rt.k)+tailLen(sl), -1
			}
		}
	}
	for _, st := range [2]*table{t, nt} {
		if st == nil || st.stashN.Load() == 0 {
			continue
		}
		if i := st.stashMatch(f, v, g); i >= 0 {
			if n := int(st.k) + tailLen(st.stashEntries()[i]&laneMask); n > bestBits {
				bestTab, bestLane, bestBits, bestSt = st, -1, n, i
			}
		}
	}
	if bestBits < 0 {
		return false
	}
	// Clearing a slot moves nothing, so it bumps no stripe.
	if bestSt >= 0 {
		bestTab.count(bestTab.stashEntries()[bestSt]&laneMask, -1)
		bestTab.stashRemove(bestSt)
	} else {
		w := bestTab.buckets[bestB]
		bestTab.count(laneOf(w, bestLane), -1)
		atomic.StoreUint64(&bestTab.buckets[bestB], withLane(w, bestLane, 0))
	}
	s.deletes.Add(1)
	s.copies.Add(-1)
	s.fullAt = 0
	if nt == nil && t.stashN.Load() != 0 {
		s.drainStashLocked(t)
	}
	return true
}

// drainStashLocked moves stashed slots back into buckets that have room.
func (s *Shard) drainStashLocked(t *table) {
	for i := 0; i < len(t.stashEntries()); {
		e := t.stashEntries()[i]
		b, sl := e>>laneBits, e&laneMask
		// A move from the stash (filed under b) to b or its alternate:
		// the slot is written to a bucket before it leaves the stash, and
		// a reader may have checked that bucket before the write and the
		// stash after the removal.
		dst, dsl := b, sl
		if freeLane(t.buckets[b]) < 0 {
			dst, dsl = t.other(b, sl)
		}
		if freeLane(t.buckets[dst]) < 0 {
			i++
			continue
		}
		s.vers.open(b, dst)
		t.put(dst, dsl)
		t.stashRemove(i)
		s.vers.close(b, dst)
	}
}

// Len returns the number of items in the shard: inserts minus deletes,
// counting repeated inserts of one item.
func (s *Shard) Len() int {
	ins, del := s.counts()
	return int(ins - del)
}

// counts returns the shard's inserts and deletes as they were at one
// moment: deletes read on both sides of inserts, until no delete came in
// between. (Two plain loads could pair inserts made after the deletes
// were read with them, and overstate the items by any number.)
func (s *Shard) counts() (inserts, deletes uint64) {
	for {
		d := s.deletes.Load()
		i := s.inserts.Load()
		if s.deletes.Load() == d {
			return i, d
		}
	}
}

// LoadFactor returns the fraction of slots in use, the copies of void
// entries included. While the shard doubles it counts the slots of the
// table being filled. It takes no lock.
func (s *Shard) LoadFactor() float64 {
	t := s.tab.Load()
	if nt := t.next.Load(); nt != nil {
		t = nt
	}
	return float64(s.copies.Load()) / float64(len(t.buckets)*slotsPerBucket)
}

// Doublings returns how many times the shard has doubled.
func (s *Shard) Doublings() int {
	return int(s.doublings.Load())
}

// shardBytes is the memory of a Shard value.
const shardBytes = int(unsafe.Sizeof(Shard{}))
