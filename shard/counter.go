package shard

import (
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cuckooguard/cuckooguard/internal/memsize"
)

// Writes that take no lock (issue 51). An insert that finds a free slot
// in one of its two buckets, and a delete that finds its entry, change one
// bucket word with one compare-and-swap and take no mutex. What they
// write besides that word lives in per-P counter stripes: each writer
// counts on the stripe of the P it runs on (chosen through a sync.Pool,
// whose objects are per-P, as xsync's counters do), and flushes the
// occupied slots to the shard's count every few writes (see flushBatch),
// so that a write moves no cache line from another core but its
// bucket's, unless two writers hit the same bucket.
//
// Each per-P stripe also holds the writers' half of a gate. A lock-free
// writer marks itself active on its stripe, checks that the stripe's gate
// is open, writes, and unmarks itself. A holder of the mutex that must
// exclude lock-free writers for a while (a doubling, from its first split
// to its end, and an encoding) closes the gate on every stripe and then
// waits until no stripe has an active writer. Both sides store before they
// load (sequentially consistent atomics): either the writer sees the gate
// closed, or the closer sees the writer active and waits for it. Writers
// that find the gate closed take the mutex, as every write did before.
//
// Evictions, stash moves and deletes under the mutex run while the gate is
// open, concurrently with lock-free writers, so they write with
// compare-and-swap too and revalidate what they found (see
// movePathLocked).

// counterStripe is one cache line of a shard's per-P counters.
type counterStripe struct {
	// active counts the lock-free writers inside the gate on this stripe.
	active atomic.Int32
	// closed is the gate: set on every stripe by closeGateLocked.
	closed atomic.Bool
	// inserts and deletes count the items inserted (ReadFrom's included)
	// and deleted through this stripe; both only grow.
	inserts atomic.Uint64
	deletes atomic.Uint64
	// flushed is the net number of occupied slots that this stripe's
	// inserts and deletes added and that were flushed to Shard.copies:
	// the stripe holds back inserts - deletes - flushed. (Deriving it,
	// rather than counting it too, saves each write an atomic add.)
	flushed atomic.Int64
	_       [cacheLine - 32]byte
}

// token picks a writer's stripe. Tokens live in a sync.Pool, whose
// objects are kept per P, so that a goroutine usually gets its P's token.
// They are numbered in the order they are made, so that the first P's
// tokens of a process fall on different stripes.
type token struct{ i uint32 }

var (
	tokenCount atomic.Uint32
	tokens     = sync.Pool{New: func() any { return &token{i: tokenCount.Add(1) - 1} }}
)

// stripeCount returns the number of per-P stripes a shard of 2^k buckets
// made now gets: GOMAXPROCS, or the CPU count if that is smaller, rounded
// up to a power of two, at most maxStripes; but 1 where their cache lines
// would take more than 1/128 of the table's memory (a small shard, whose
// writers then share one line, as under the mutex before): guards are
// sized to about 18–20 bits per key, and a tenth of a bit per key is the
// most the stripes may add.
func stripeCount(k int) int {
	n := min(runtime.GOMAXPROCS(0), runtime.NumCPU(), maxStripes)
	n = 1 << bits.Len(uint(n-1))
	if cacheLine*n*128 > 8<<k {
		return 1
	}
	return n
}

// maxStripes bounds the per-P stripes of a shard: 64 of them take 4 KiB.
const maxStripes = 64

// counterBytes returns the heap memory of n counter stripes, rounded up to
// the allocator's size class.
func counterBytes(n int) int {
	return memsize.Of(cacheLine*n, false)
}

// initCounters allocates the counter stripes of s, whose table has 2^k
// buckets. A power-of-two number of cache lines falls in a size class of
// its own size, so the stripes start on a cache line.
func (s *Shard) initCounters(k int) {
	n := stripeCount(k)
	s.cnt = &make([]counterStripe, n)[0]
	s.cntMask = uint32(n - 1)
}

// stripes returns the number of per-P stripes, for range loops.
func (s *Shard) stripes() int {
	return int(s.cntMask) + 1
}

// stripe returns stripe i, i < s.stripes().
func (s *Shard) stripe(i int) *counterStripe {
	return (*counterStripe)(unsafe.Add(unsafe.Pointer(s.cnt), uintptr(i)*cacheLine))
}

// perP returns the per-P stripe of the calling goroutine.
func (s *Shard) perP() *counterStripe {
	tk := tokens.Get().(*token)
	i := tk.i & s.cntMask
	tokens.Put(tk)
	return s.stripe(int(i))
}

// enter marks a lock-free writer active on st and reports whether the
// gate is open; if not, the writer is not active and takes the mutex.
func (st *counterStripe) enter() bool {
	st.active.Add(1)
	if st.closed.Load() {
		st.active.Add(-1)
		return false
	}
	return true
}

// leave ends a lock-free write begun by enter.
func (st *counterStripe) leave() {
	st.active.Add(-1)
}

// closeGateLocked closes the gate and waits until no lock-free writer is
// inside: afterwards only holders of the mutex write buckets, until
// openGateLocked. The caller holds s.mu. A lock-free write takes a few
// nanoseconds; the wait yields in case the writer was preempted.
func (s *Shard) closeGateLocked() {
	for i := range s.stripes() {
		s.stripe(i).closed.Store(true)
	}
	for i := range s.stripes() {
		for s.stripe(i).active.Load() != 0 {
			runtime.Gosched()
		}
	}
}

// openGateLocked opens the gate closed by closeGateLocked. The caller
// holds s.mu.
func (s *Shard) openGateLocked() {
	for i := range s.stripes() {
		s.stripe(i).closed.Store(false)
	}
}

// flushBatch returns how many copies a stripe gathers before it flushes
// them to Shard.copies, for a shard writing t: a power of two, at most
// 32, such that all stripes together hold back at most slots/256 (a load
// factor of 0.4%), or 1 for small tables. The flushed count, which
// decides when a shard is due to double (GrowthDue), thus lags the true
// count by at most that much.
func (s *Shard) flushBatch(t *table) int64 {
	sh := int(t.k) + 2 - 8 - bits.Len32(s.cntMask)
	return 1 << min(max(sh, 0), 5)
}

// countInsert counts one item inserted into t through stripe st.
func (s *Shard) countInsert(st *counterStripe, t *table) {
	n := st.inserts.Add(1)
	if c := int64(n-st.deletes.Load()) - st.flushed.Load(); c >= s.flushBatch(t) {
		s.flush(st, c, t)
	}
}

// countDelete counts one item deleted from t through stripe st.
func (s *Shard) countDelete(st *counterStripe, t *table) {
	n := st.deletes.Add(1)
	if c := int64(st.inserts.Load()-n) - st.flushed.Load(); -c >= s.flushBatch(t) {
		s.flush(st, c, t)
	}
}

// flush moves c copies from stripe st to Shard.copies, and marks the
// shard due to double if that brings it to its growth policy's threshold
// in t. The shard's count is added before st's is taken back, so that
// their sum never understates the copies. Two writers of one stripe may
// both flush what they saw held back: each adds to both sides, so the
// sum stays exact, and the stripe then holds back a negative amount that
// its next flush returns.
func (s *Shard) flush(st *counterStripe, c int64, t *table) {
	n := s.copies.Add(c)
	st.flushed.Add(c)
	if g := s.growth; c > 0 && g != nil && !s.due.Load() &&
		float64(n) >= g.threshold*float64(len(t.buckets)*slotsPerBucket) {
		s.due.Store(true)
	}
}

// addCopies adds n to the shard's occupied slots: for the void copies of
// a doubling.
func (s *Shard) addCopies(n int64) {
	s.copies.Add(n)
}

// copiesNow returns the shard's occupied slots: the flushed count and
// what the stripes hold back. It reads every stripe.
func (s *Shard) copiesNow() int64 {
	n := s.copies.Load()
	for i := range s.stripes() {
		st := s.stripe(i)
		d := st.deletes.Load()
		n += int64(st.inserts.Load()-d) - st.flushed.Load()
	}
	return n
}

// insertsNow and deletesNow return the sums over the stripes.
func (s *Shard) insertsNow() uint64 {
	var n uint64
	for i := range s.stripes() {
		n += s.stripe(i).inserts.Load()
	}
	return n
}

func (s *Shard) deletesNow() uint64 {
	var n uint64
	for i := range s.stripes() {
		n += s.stripe(i).deletes.Load()
	}
	return n
}

// GrowthDue reports whether a write found the shard at its growth
// policy's threshold since it last doubled: a hint, cheap enough to ask
// after every insert, that [Shard.NeedsGrowth], which reads every counter
// stripe, may hold. Writers count on per-P stripes and flush to the
// shard's count every few writes, so the hint comes at most slots/256
// copies (a load factor of 0.4%) after the threshold, or exactly at it
// for shards of fewer than 2^8 buckets per stripe.
func (s *Shard) GrowthDue() bool {
	return s.due.Load()
}
