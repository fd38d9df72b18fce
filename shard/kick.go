package shard

import (
	"sync"
	"sync/atomic"
)

// An insert whose two buckets are full makes room by evicting: it moves an
// entry of one bucket to that entry's alternate bucket, which may evict
// another, and so on until one lands in a free slot. The path is found
// first, breadth-first and without moving anything (as libcuckoo does),
// then carried out from its free end back to the insert's bucket, each
// entry copied into its new bucket before it is cleared from the old one.
// Lookups see one short window on the stripes of the path's buckets (see
// seqlock.go), not a walk that holds the shard in motion; and a search
// that finds nothing has changed nothing, so there is nothing to undo.

const (
	// maxPathLen bounds an eviction path: the insert's bucket and up to
	// this many further buckets.
	maxPathLen = 5
	// maxPathNodes bounds the buckets one search reads. Breadth-first, a
	// full search of depth maxPathLen reads 2·(4+16+64+256+1024) buckets;
	// this cap stops it a little earlier.
	maxPathNodes = 1500
)

// pathNode is one bucket of the search: in is the slot that moves into
// bucket b, evicted from lane lane of the parent node's bucket, where the
// search found it as out (for a root, in is the new item's slot).
type pathNode struct {
	b      uint64
	in     uint64
	out    uint64
	parent int32 // -1 for the two roots
	lane   int8
	depth  int8
}

// pathPool holds the scratch of the searches: one per writer searching at
// the same moment, not one per shard, which cost every shard up to
// maxPathNodes·24 bytes (36 KB) that no figure counted. A search at a
// load below 0.9 reads a few dozen buckets, one near a full table up to
// maxPathNodes. The pool keeps scratch of up to pooledPathNodes (6 KB);
// a longer one is garbage once its search ends, so that what stays on the
// heap of a guard is what its Stats count (see guard.WithMaxBytes).
var pathPool = sync.Pool{New: func() any {
	nodes := make([]pathNode, 0, pooledPathNodes)
	return &nodes
}}

// pooledPathNodes is the capacity of the scratch that pathPool keeps:
// room for a search that expands 60 buckets, which covers all but a few
// in ten thousand searches at load 0.9.
const pooledPathNodes = 256

// kickLocked makes room for an item whose candidate buckets b1 and b2
// (with its slots s1 and s2 there) are both full, and stores it. It
// returns the slot the item got, or ErrFull if no path within reach ends
// in a free slot and the stash is full; the shard is then unchanged. A
// path that ends in a full bucket parks that bucket's first entry in the
// stash. It returns errMoved if a lock-free writer changed the path
// before it was carried out (see movePathLocked): the item is not stored
// and the shard holds what it held. The caller holds s.mu; t is not
// migrating (or is the new table of a doubling that is finishing under
// every stripe, with bump false).
func (s *Shard) kickLocked(t *table, b1, s1, b2, s2 uint64, bump bool) (uint64, error) {
	s.searches++
	p := pathPool.Get().(*[]pathNode)
	nodes := append((*p)[:0], pathNode{b: b1, in: s1, parent: -1}, pathNode{b: b2, in: s2, parent: -1})
	defer func() {
		if cap(nodes) <= pooledPathNodes {
			*p = nodes[:0]
			pathPool.Put(p)
		}
	}()
	for i := 0; i < len(nodes); i++ {
		n := nodes[i]
		w := t.load(n.b)
		if freeLane(w) >= 0 {
			return s.movePathLocked(t, nodes, i, 0, false, bump)
		}
		if n.depth == maxPathLen || len(nodes)+slotsPerBucket > maxPathNodes {
			continue
		}
		for l := range slotsPerBucket {
			out := laneOf(w, l)
			ob, os := t.other(n.b, out)
			if onPath(nodes, i, ob) {
				continue // a path visits a bucket once
			}
			nodes = append(nodes, pathNode{b: ob, in: os, out: out, parent: int32(i), lane: int8(l), depth: n.depth + 1})
		}
	}
	// No free slot within reach: the last node's bucket gives its first
	// entry to the stash, if the stash has room.
	if t.stashN.Load() >= StashSize {
		return 0, ErrFull
	}
	return s.movePathLocked(t, nodes, len(nodes)-1, 0, true, bump)
}

// onPath reports whether bucket b is on the path from node i to its root.
func onPath(nodes []pathNode, i int, b uint64) bool {
	for ; i >= 0; i = int(nodes[i].parent) {
		if nodes[i].b == b {
			return true
		}
	}
	return false
}

// movePathLocked carries out the path from node end to its root: node
// end's slot goes into a free lane of its bucket (with stash set, into
// lane lane, whose entry goes to the stash first), and each node's
// parent's slot goes into the lane its entry left. Every entry is copied
// before it is overwritten, and the stripes of every bucket of the path
// are odd throughout (bump makes them so; a caller that holds every
// stripe odd already passes false). It returns the slot stored in the
// root's bucket: the new item's.
//
// Lock-free writers run meanwhile (counter.go). An insert can only fill a
// free lane, which a move never counts on but at the path's end; a delete
// can clear an entry the path is about to move. So each bucket is written
// with compare-and-swap, and the lane to overwrite must still hold the
// entry the search found there. If it does not, the entry was deleted
// after its copy reached the child's bucket: the copy is taken back, and
// the path is given up with errMoved. Every move carried out until then
// is complete (copied, then overwritten), so the shard holds what it held
// and the insert searches again. (A lane deleted and refilled with an
// equal slot counts as the same entry: equal slots in one bucket cannot be
// told apart.)
func (s *Shard) movePathLocked(t *table, nodes []pathNode, end, lane int, stash, bump bool) (uint64, error) {
	var mask uint64 // stripes of the path's buckets
	for i := end; i >= 0; i = int(nodes[i].parent) {
		mask |= 1 << stripeOf(nodes[i].b)
	}
	eb := nodes[end].b
	var e0, sb, ss uint64 // the stashed entry, filed under its alternate bucket
	if stash {
		if e0 = laneOf(t.load(eb), lane); e0 == 0 {
			return 0, s.givenUp() // a delete made room: search again
		}
		sb, ss = t.other(eb, e0)
		mask |= 1 << stripeOf(sb)
	}
	if !bump {
		mask = 0
	}
	s.vers.openMask(mask)
	defer s.vers.openMask(mask) // closes: every stripe of the mask is even again
	if stash {
		t.stashAdd(sb, ss)
		for {
			w := t.load(eb)
			if laneOf(w, lane) != e0 {
				t.stashRemove(len(t.stashEntries()) - 1)
				return 0, s.givenUp()
			}
			if t.cas(eb, w, withLane(w, lane, nodes[end].in)) {
				break
			}
		}
	} else if !t.put(eb, nodes[end].in) {
		return 0, s.givenUp() // a lock-free insert took the free lane
	}
	root, child := nodes[end].in, end
	for i := int(nodes[end].parent); i >= 0; i = int(nodes[i].parent) {
		c, n := &nodes[child], &nodes[i]
		l := int(c.lane)
		for {
			w := t.load(n.b)
			if laneOf(w, l) != c.out {
				t.removeSlot(c.b, c.in)
				return 0, s.givenUp()
			}
			if t.cas(n.b, w, withLane(w, l, n.in)) {
				break
			}
		}
		root, child = n.in, i
	}
	return root, nil
}

// pathsGivenUp counts the eviction paths given up because a lock-free
// delete changed them, in every shard: for tests, which check that they
// race what they mean to race.
var pathsGivenUp atomic.Uint64

// givenUp counts a path given up and returns errMoved.
func (s *Shard) givenUp() error {
	pathsGivenUp.Add(1)
	return errMoved
}
