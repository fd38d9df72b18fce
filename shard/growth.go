package shard

import (
	"fmt"
	"sync/atomic"
)

// Limits of a [Growth] policy.
const (
	// DefaultGrowThreshold is the load factor at which a shard under the
	// default policy wants to double.
	DefaultGrowThreshold = 0.9
	// MinGrowThreshold and MaxGrowThreshold bound the grow threshold:
	// below 0.5 a doubled shard would be past the threshold again at
	// once, and items with random positions fill a (2,4)-cuckoo table to
	// about 0.95 before an insert fails.
	MinGrowThreshold = 0.5
	MaxGrowThreshold = 0.95
	// MinGrowLoad is the load factor below which a shard refuses to double
	// for an insert that found no room (see [ErrFull]): the insert failed
	// because items that agree on every bit the shard compares crowd its
	// two buckets, and a doubling would not separate them. Doubling anyway
	// would let such items grow the shard without bound.
	MinGrowLoad = 0.5
)

// Growth is the growth policy of a set of shards, such as the shards of
// one guard: the load factor at which a shard should double, and a memory
// cap that all of them reserve their tables from. It owns every decision
// about growing, so that the shards' callers only choose who does the
// work and when (package resize runs doublings in the background):
//
//   - A shard attached with [Shard.SetGrowth] reserves its memory from the
//     policy, and every doubling reserves the new table before it
//     allocates it and releases the old one when it finishes. A table's
//     reservation includes room for its stash, full ([Shard.ReservedBytes]),
//     so that what [Shard.Stats] counts never passes the cap.
//   - [Shard.Insert] doubles a shard that has no room for an item, in the
//     caller's goroutine, unless the memory cap or a crowd of colliding
//     items says no; it then returns an error that wraps [ErrFull] and
//     says which.
//   - [Shard.NeedsGrowth] reports a shard past the threshold, and
//     [Shard.GrowStep] begins and runs its doubling, chunk by chunk.
//
// A Growth is safe for concurrent use by multiple goroutines.
type Growth struct {
	threshold float64
	max       int64 // 0: no cap
	used      atomic.Int64
	refused   atomic.Int64
}

// NewGrowth returns a growth policy that doubles shards at load factor
// threshold, in [MinGrowThreshold, MaxGrowThreshold], and caps the memory
// they reserve at maxBytes bytes (0 for no cap).
func NewGrowth(threshold float64, maxBytes int64) (*Growth, error) {
	if !(threshold >= MinGrowThreshold && threshold <= MaxGrowThreshold) { // also rejects NaN
		return nil, fmt.Errorf("shard: grow threshold %v out of range [%v, %v]", threshold, MinGrowThreshold, MaxGrowThreshold)
	}
	if maxBytes < 0 {
		return nil, fmt.Errorf("shard: memory cap %d bytes must not be negative", maxBytes)
	}
	return &Growth{threshold: threshold, max: maxBytes}, nil
}

// Threshold returns the load factor at which a shard should double.
func (g *Growth) Threshold() float64 { return g.threshold }

// MaxBytes returns the memory cap; 0 means none.
func (g *Growth) MaxBytes() int64 { return g.max }

// UsedBytes returns the memory reserved: what [Growth.Reserve] took, the
// shards attached and their tables with room for full stashes, both
// tables of a shard while it doubles. It is at most the cap, and at least
// the sum of what their Stats count as Bytes.
func (g *Growth) UsedBytes() int64 { return g.used.Load() }

// Refused returns the number of doublings the memory cap refused.
func (g *Growth) Refused() int64 { return g.refused.Load() }

// Reserve reserves n bytes of memory that the shards' owner holds besides
// them, so that the cap counts it too. It returns an error that wraps
// [ErrFull] if that would pass the cap, and reserves nothing then.
func (g *Growth) Reserve(n int64) error {
	if !g.reserve(n) {
		return fmt.Errorf("%w: %d bytes more would pass the memory cap of %d bytes, %d of them in use", ErrFull, n, g.max, g.used.Load())
	}
	return nil
}

// reserve adds n bytes to the memory in use and reports whether that stays
// within the cap.
func (g *Growth) reserve(n int64) bool {
	for {
		used := g.used.Load()
		if g.max != 0 && used+n > g.max {
			return false
		}
		if g.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// fits reports whether n more bytes would stay within the cap now.
func (g *Growth) fits(n int64) bool {
	return g.max == 0 || g.used.Load()+n <= g.max
}

// SetGrowth puts s under growth policy g: s reserves from g the memory it
// holds now with room for a full stash ([Shard.ReservedBytes]), and from
// then on inserts double
// s when it has no room, and [Shard.NeedsGrowth] and [Shard.GrowStep]
// follow g's threshold. Call it once, after [Shard.Init] or
// [Shard.ReadFrom] and before the shard is shared. It returns an error
// that wraps [ErrFull] if the memory cap cannot hold s, and an error if g
// is nil or s has a policy already; s is then unchanged.
//
// A shard without a policy never doubles by itself: an insert that finds
// no room returns ErrFull, and only [Shard.Grow] doubles it.
func (s *Shard) SetGrowth(g *Growth) error {
	if g == nil {
		return fmt.Errorf("shard: SetGrowth needs a policy")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.growth != nil {
		return fmt.Errorf("shard: SetGrowth: the shard has a growth policy already")
	}
	if err := g.Reserve(int64(s.ReservedBytes())); err != nil {
		return err
	}
	s.growth = g
	return nil
}

// ReservedBytes returns the memory that a growth policy reserves for s:
// what [Shard.Stats] counts as Bytes, with each table's stash counted as
// large as its room (StashSize entries, or what a doubling or ReadFrom
// left in it if more). A stash grows while its table fills, under no lock
// of the policy's, so its room is reserved with the table: the memory the
// shard holds never passes the policy's cap.
func (s *Shard) ReservedBytes() int {
	t := s.tab.Load()
	n := int64(s.fixedBytes()) + t.reservedBytes()
	if nt := t.next.Load(); nt != nil {
		n += nt.reservedBytes()
	}
	return int(n)
}

// ReserveFor returns what [Shard.ReservedBytes] is for an empty shard of
// 2^log2Buckets buckets: [BytesFor] and room for a full stash.
func ReserveFor(log2Buckets int) int {
	return BytesFor(log2Buckets) + stashBytes(StashSize)
}

// nextStashRoom is the stash room of the table that doubles t: a
// doubling moves t's stash into the new table, where an entry that finds
// no place stays stashed, a void one in each of its two children (see
// finishLocked). t's stash does not grow while it doubles (an insert
// finishes the doubling before it evicts).
func nextStashRoom(t *table) int32 {
	return max(StashSize, 2*t.stashN.Load())
}

// doublingBytes returns what a growth policy reserves for the table that
// doubles t with a stash room of room entries: that table's reservedBytes.
func doublingBytes(t *table, room int32) int64 {
	return int64(tableBytes(2*len(t.buckets)) + stashBytes(int(room)))
}

// NeedsGrowth reports whether s has a growth policy, has reached its
// threshold, is not doubling or saturated, and the memory cap has room for
// its next table: whether [Shard.GrowStep] would begin a doubling now. It
// takes no lock; writers call it after inserts to hand the shard to a
// background worker.
func (s *Shard) NeedsGrowth() bool {
	g := s.growth
	if g == nil {
		return false
	}
	if s.LoadFactor() < g.threshold {
		if s.due.Load() {
			s.due.Store(false) // deletes brought it back: see GrowthDue
		}
		return false
	}
	t := s.tab.Load()
	return t.next.Load() == nil && t.k < maxTableLog2 && g.fits(doublingBytes(t, nextStashRoom(t)))
}

// growFor doubles s for an insert that found no room while s had finished
// doublings doublings: it begins the doubling, or helps finish the one in
// progress, and returns once none is in progress, releasing the mutex
// between chunks. If s doubled since, it returns at once. Either way the
// caller retries its insert. It returns an error wrapping ErrFull when
// the doubling is refused: the shard is saturated, crowded (less than
// MinGrowLoad full) or the memory cap has no room.
func (s *Shard) growFor(doublings int) error {
	s.mu.Lock()
	if int(s.doublings.Load()) != doublings {
		s.mu.Unlock()
		return nil
	}
	t := s.tab.Load()
	var err error
	switch {
	case t.next.Load() != nil:
		// A doubling in progress: help finish it.
	case t.k >= maxTableLog2:
		err = errFullSaturated
	case s.LoadFactor() < MinGrowLoad:
		err = errFullCrowded
	default:
		_, err = s.beginGrowLocked()
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	for !s.GrowStep(DefaultChunk) {
	}
	return nil
}

// beginGrowLocked starts a doubling and reports whether it did: false if
// one is already in progress. It returns [ErrSaturated] if the table
// cannot double, and an error wrapping [ErrFull] if the shard's growth
// policy has no memory for the new table. The caller holds s.mu.
func (s *Shard) beginGrowLocked() (bool, error) {
	t := s.tab.Load()
	if t.next.Load() != nil {
		return false, nil
	}
	if t.k >= maxTableLog2 {
		return false, ErrSaturated
	}
	room := nextStashRoom(t)
	if g := s.growth; g != nil && !g.reserve(doublingBytes(t, room)) {
		g.refused.Add(1)
		return false, errFullMaxBytes
	}
	nt := s.newTableLocked(t.k + 1)
	nt.stashRoom = room
	// Nothing moves yet (the cursor is 0), so readers need no retry.
	t.next.Store(nt)
	// A lock-free write to a bucket the split has read would be lost:
	// writers take the mutex until the doubling ends (finishLocked opens
	// the gate again), and those inside finish first.
	s.closeGateLocked()
	return true, nil
}
