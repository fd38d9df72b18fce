package shard

import (
	"errors"
	"fmt"
	"math/bits"
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

// writeSide is what writers under the mutex use besides buckets, on the
// line that Lock takes anyway. Lock-free writers (counter.go) touch none
// of it: they count on per-P stripes, so that a write moves no line of
// the shard's between the cores of the writers (issues 34 and 51).
type writeSide struct {
	mu sync.Mutex // protects searches, fullDeletes, the stash and the gate
	// cnt points to the first of cntMask+1 per-P counter stripes: the
	// items inserted and deleted, the occupied slots, the lock-free
	// writers' gate (see counter.go). Set by Init, never changed.
	cnt       *counterStripe
	cntMask   uint32
	doublings atomic.Int32 // written under mu
	// searches counts the searches for an eviction path, for tests: a
	// failed search moves nothing and bumps no version.
	searches int32
	// due is set when a flush of a stripe's copies finds the shard at its
	// growth policy's threshold (see GrowthDue).
	due     atomic.Bool
	retries atomic.Uint64
	// copies holds the occupied slots that the stripes flushed, and
	// the void copies of doublings; the shard's are its sum with theirs.
	copies atomic.Int64
	// fullDeletes is 1 + the shard's deletes when a search for an
	// eviction path last failed, 0 if none has since the last doubling.
	// An insert that would need a search fails at once while no delete
	// came since: writers retrying on a full shard would otherwise search
	// it, up to maxPathNodes bucket reads each, again and again.
	fullDeletes uint64
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
	s.initCounters(log2Buckets)
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
	if done, err := s.insertFast(f, v); done {
		return err
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

// insertFast is the insert that takes no lock: one compare-and-swap of a
// bucket with a free lane, when the gate is open (no doubling, no
// encoding) and neither bucket holds a copy of the item's slot already.
// It reports false, having changed nothing, when the insert must take the
// mutex instead.
//
// MaxCopies: two writers that insert copies of one item at once each
// counted the copies before the other's landed. So every insert counts
// again after its own compare-and-swap, and takes its copy back if there
// are too many: of two inserts racing, the second to count sees the first
// one's copy (each writes before it reads again), so the copies kept never
// exceed MaxCopies. (Both may see the other's, and both refuse: the item
// is present all the same. A copy taken back counts as an insert and a
// delete.)
func (s *Shard) insertFast(f uint8, v uint64) (bool, error) {
	st := s.perP()
	if !st.enter() {
		return false, nil
	}
	t := s.tab.Load()
	b1, s1, b2, s2 := t.slots(f, v, alt(f))
	for {
		w1, w2 := t.load(b1), t.load(b2)
		if equalLanes(w1, s1)+equalLanes(w2, s2) != 0 {
			// Copies of the item: the mutex path counts them with the
			// stash's.
			st.leave()
			return false, nil
		}
		b, sl, w := b1, s1, w1
		i := freeLane(w1)
		if i < 0 {
			b, sl, w = b2, s2, w2
			if i = freeLane(w2); i < 0 {
				st.leave()
				return false, nil // both full: an eviction, under the mutex
			}
		}
		if t.cas(b, w, withLane(w, i, sl)) {
			break
		}
		// Another writer changed the bucket: look again.
	}
	// Counted inside the gate, so that an encoding, which closes it,
	// finds the counts of the buckets it writes.
	s.countInsert(st, t)
	st.leave()
	// Count the copies again. The stripe of b1 validates the two reads
	// against moves between b1 and b2, as a lookup's does; a stash or
	// an unstable read leaves the count to the mutex path.
	vs := stripeOf(b1)
	ver := s.vers[vs].Load()
	n := equalLanes(t.load(b1), s1) + equalLanes(t.load(b2), s2)
	if n > 1 || t.stashN.Load() != 0 || !s.vers.stable(vs, ver) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.copiesLocked(f, v) > MaxCopies {
			// Taken back as a delete: the insert was counted.
			s.deleteLocked(f, v, true)
			s.tab.Load().refused.Add(1)
			return true, ErrTooManyCopies
		}
	}
	return true, nil
}

// copiesLocked returns the number of entries in the item's two buckets
// and the stashes that equal the slot a new copy of it gets there,
// resolving each bucket through the migration cursor. The caller holds
// s.mu.
func (s *Shard) copiesLocked(f uint8, v uint64) int {
	t := s.tab.Load()
	nt := t.next.Load()
	cur := t.cursor.Load()
	n := 0
	for _, vc := range [2]uint64{v, v ^ alt(f)} {
		rt := t.resolve(nt, cur, vc)
		b, _, sl := rt.candidate(f, vc)
		n += equalLanes(rt.load(b), sl) + rt.stashEqual(b, sl)
	}
	return n
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
	for {
		err := s.insertLocked(f, v)
		if err != errMoved {
			return doublings, err
		}
	}
}

// errMoved says that an eviction path was given up because a lock-free
// delete changed it (see movePathLocked): the insert searches again.
var errMoved = errors.New("shard: eviction path changed")

// insertLocked is one try of insert. It returns errMoved if an eviction
// path changed under it; the shard then holds everything it held and
// the item is not inserted.
func (s *Shard) insertLocked(f uint8, v uint64) error {
	if s.copiesLocked(f, v) >= MaxCopies {
		s.tab.Load().refused.Add(1)
		return ErrTooManyCopies
	}
	t := s.tab.Load()
	g := alt(f)
	if nt := t.next.Load(); nt != nil {
		// Migrating (the gate is closed: no lock-free writer): a free
		// slot in either resolved bucket is enough.
		cur := t.cursor.Load()
		for _, vc := range [2]uint64{v, v ^ g} {
			rt := t.resolve(nt, cur, vc)
			b, _, sl := rt.candidate(f, vc)
			if rt.put(b, sl) {
				s.added(rt, sl)
				return nil
			}
		}
		// Evictions would have to cross the cursor: help finish the
		// migration first, then insert into the doubled table.
		s.finishGrowLocked()
		t = s.tab.Load()
	}
	b1, s1, b2, s2 := t.slots(f, v, g)
	placed := t.put(b1, s1) || t.put(b2, s2)
	if !placed {
		if s.fullDeletes != 0 && s.deletesNow()+1 == s.fullDeletes {
			return ErrFull
		}
		_, err := s.kickLocked(t, b1, s1, b2, s2, true)
		if err == ErrFull {
			s.fullDeletes = s.deletesNow() + 1
		}
		if err != nil {
			return err
		}
	}
	// Lock-free inserts of the same item may have landed since the count
	// (see insertFast): count again.
	if s.copiesLocked(f, v) > MaxCopies {
		s.deleteLocked(f, v, false)
		t.refused.Add(1)
		return ErrTooManyCopies
	}
	s.added(t, s1) // s1 and s2 have the same tail length
	return nil
}

// added counts a new item whose slot s was stored in t. The caller holds
// s.mu.
func (s *Shard) added(t *table, sl uint64) {
	s.countInsert(s.perP(), t)
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
	if s.deleteFast(f, v) {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deleteLocked(f, v, true)
}

// deleteFast is the delete that takes no lock: one compare-and-swap that
// clears the item's most specific entry in its two buckets, when the gate
// is open, the stash is empty, and the stripe of the item's first bucket
// says that no entry moved between the two while they were read (an
// entry in motion could be the most specific one; see Delete). It
// reports false, having changed nothing, when the delete must take the
// mutex instead: also when it finds no entry, so that a miss is decided
// where the stash is searched too.
func (s *Shard) deleteFast(f uint8, v uint64) bool {
	st := s.perP()
	if !st.enter() {
		return false
	}
	t := s.tab.Load()
	b1, p1, b2, p2 := t.probes(f, v, alt(f))
	vs := stripeOf(b1)
	for try := 0; try < 4; try++ {
		ver := s.vers[vs].Load()
		w1, w2 := t.load(b1), t.load(b2)
		if t.stashN.Load() != 0 || !s.vers.stable(vs, ver) {
			break
		}
		b, w, lane := bestLane(w1, matchLanes(w1, p1), b1, w2, matchLanes(w2, p2), b2)
		if lane < 0 {
			break
		}
		// A concurrent move that takes this entry out of b changes b's
		// word, so the swap fails; one that copied it elsewhere already
		// takes the copy back when it finds the entry gone (see
		// movePathLocked).
		if t.cas(b, w, withLane(w, lane, 0)) {
			t.count(laneOf(w, lane), -1)
			s.countDelete(st, t) // inside the gate, as insertFast counts
			st.leave()
			return true
		}
	}
	st.leave()
	return false
}

// bestLane returns, of the lanes marked in m1 of bucket b1 (word w1) and
// m2 of bucket b2 (word w2), as matchLanes marks them, the bucket, word
// and lane of the one with the longest tail, the first of them if several;
// lane -1 if none is marked.
func bestLane(w1, m1, b1, w2, m2, b2 uint64) (b, w uint64, lane int) {
	lane, best := -1, -1
	for j, m := range [2]uint64{m1, m2} {
		bj, wj := b1, w1
		if j == 1 {
			bj, wj = b2, w2
		}
		for ; m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(m) / laneBits
			if tl := tailLen(laneOf(wj, i)); tl > best {
				b, w, lane, best = bj, wj, i, tl
			}
		}
	}
	return b, w, lane
}

// deleteLocked is Delete under the mutex; count says whether the delete
// counts as one (not when an insert takes back its own copy). Lock-free
// writers may run (unless the shard is doubling): the entry is cleared
// with compare-and-swap, and searched again if its bucket changed.
func (s *Shard) deleteLocked(f uint8, v uint64, count bool) bool {
	for {
		ok, retry := s.deleteOnceLocked(f, v, count)
		if !retry {
			return ok
		}
	}
}

// deleteOnceLocked is one try of deleteLocked; retry reports that a
// lock-free writer changed the bucket of the entry found first.
func (s *Shard) deleteOnceLocked(f uint8, v uint64, count bool) (ok, retry bool) {
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
		bestW    uint64
		bestLane = -1
		bestBits = -1
		bestSt   = -1
	)
	for _, vc := range [2]uint64{v, v ^ g} {
		rt := t.resolve(nt, cur, vc)
		b, pb, _ := rt.candidate(f, vc)
		w := rt.load(b)
		for i := range slotsPerBucket {
			if sl := laneOf(w, i); slotMatches(sl, f, pb) && int(rt.k)+tailLen(sl) > bestBits {
				bestTab, bestB, bestW, bestLane, bestBits, bestSt = rt, b, w, i, int(rt.k)+tailLen(sl), -1
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
		return false, false
	}
	// Clearing a slot moves nothing, so it bumps no stripe.
	if bestSt >= 0 {
		bestTab.count(bestTab.stashEntries()[bestSt]&laneMask, -1)
		bestTab.stashRemove(bestSt)
	} else {
		if !bestTab.cas(bestB, bestW, withLane(bestW, bestLane, 0)) {
			return false, true
		}
		bestTab.count(laneOf(bestW, bestLane), -1)
	}
	if count {
		s.countDelete(s.perP(), t)
	}
	if nt == nil && t.stashN.Load() != 0 {
		s.drainStashLocked(t)
	}
	return true, false
}

// drainStashLocked moves stashed slots back into buckets that have room.
func (s *Shard) drainStashLocked(t *table) {
	for i := 0; i < len(t.stashEntries()); {
		e := t.stashEntries()[i]
		b, sl := e>>laneBits, e&laneMask
		// A move from the stash (filed under b) to b or its alternate:
		// the slot is written to a bucket before it leaves the stash, and
		// a reader may have checked that bucket before the write and the
		// stash after the removal. So the move bumps the stripes of both
		// of the entry's buckets, whichever it lands in: a lookup
		// validates with the stripe of its item's first bucket, which
		// may be either (an eviction path files an entry under its
		// alternate). Bumping only the bucket it lands in let a lookup
		// that read both buckets before the move and the stash after it
		// trust a miss of a present item (TestStashDrainInvalidatesMisses).
		// (Lock-free writers do not touch the stash; a lock-free delete
		// finds the stash not empty, or its stripe bumped, and takes the
		// mutex.)
		ob, osl := t.other(b, sl)
		dst, dsl := b, sl
		if freeLane(t.load(b)) < 0 {
			dst, dsl = ob, osl
		}
		if freeLane(t.load(dst)) < 0 {
			i++
			continue
		}
		s.vers.open(b, ob)
		if !t.put(dst, dsl) {
			s.vers.close(b, ob)
			i++ // a lock-free insert took the lane
			continue
		}
		t.stashRemove(i)
		s.vers.close(b, ob)
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
		d := s.deletesNow()
		i := s.insertsNow()
		if s.deletesNow() == d {
			return i, d
		}
	}
}

// LoadFactor returns the fraction of slots in use, the copies of void
// entries included. While the shard doubles it counts the slots of the
// table being filled. It takes no lock and reads every counter stripe.
func (s *Shard) LoadFactor() float64 {
	t := s.tab.Load()
	if nt := t.next.Load(); nt != nil {
		t = nt
	}
	return float64(s.copiesNow()) / float64(len(t.buckets)*slotsPerBucket)
}

// Doublings returns how many times the shard has doubled.
func (s *Shard) Doublings() int {
	return int(s.doublings.Load())
}

// shardBytes is the memory of a Shard value.
const shardBytes = int(unsafe.Sizeof(Shard{}))

// fixedBytes returns the memory of s besides its tables and stashes: the
// Shard value and its counter stripes.
func (s *Shard) fixedBytes() int {
	return shardBytes + counterBytes(s.stripes())
}
