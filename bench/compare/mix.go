package compare

import (
	"sync/atomic"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// A Mix is a workload of MixWorker: lookups, half of present keys and
// half of absent ones, and one write in WriteEvery operations. Writes add
// fresh keys and remove them again, so that a filter keeps its size: a
// write removes the worker's oldest fresh key once it holds Live of them,
// else it adds one, so that once Live are held writes alternate remove
// and add. A filter that cannot remove gets adds only.
type Mix struct {
	// WriteEvery is the spacing of writes (20: 5 % of operations); 0
	// means no writes.
	WriteEvery int
	// Random places the writes at random, each operation a write with
	// probability 1/WriteEvery, and picks present or absent keys for
	// lookups at random. Otherwise every WriteEvery-th operation is a
	// write, and lookups alternate present and absent keys.
	Random bool
	// Live is how many fresh keys a worker holds before a write removes
	// its oldest one.
	Live int
	// Ring is how many distinct fresh keys a worker cycles through, a
	// power of two above Live; 0 makes every add a key never added before.
	Ring int
}

// The mixes of the benchmarks.
var (
	// MixRandom is BenchmarkMixParallel's: 5 % writes at random places,
	// removing the oldest fresh key once 64 are held; no key is added
	// twice.
	MixRandom = Mix{WriteEvery: 20, Random: true, Live: 64}
	// MixRing is issue 34's 95/5 mix, as a user comparing libraries would
	// write it: every 20th operation is a write, alternately adding the
	// next key of the worker's ring of 4,096 and removing the key it added
	// 256 adds before the latest one (1 operation in 40 each), and the
	// lookups in between alternate present and absent keys. (Its first
	// 257 writes are all adds, 5,140 operations of warm-up, where the
	// issue's harness leaves every other write out: the steady state is
	// the same.)
	MixRing = Mix{WriteEvery: 20, Live: 257, Ring: 4096}
	// MixReadOnly is MixRing without its writes: the lookups alone, for
	// what the writes cost them.
	MixReadOnly = Mix{}
)

// LookupShare returns the fraction of m's operations that are lookups.
func (m Mix) LookupShare() float64 {
	if m.WriteEvery == 0 {
		return 1
	}
	return 1 - 1/float64(m.WriteEvery)
}

// Nexter is the loop condition of a mix worker; *testing.PB is one.
type Nexter interface{ Next() bool }

// MixResult counts what mix workers saw.
type MixResult struct {
	Ops            atomic.Int64
	Hits           atomic.Int64 // lookups answered present
	FalseNegatives atomic.Int64 // present keys answered absent
	Refused        atomic.Int64 // adds the filter refused
	RemoveMisses   atomic.Int64 // removes of an added key that found nothing
}

// MixWorker runs mix m on f until next.Next() is false. id must differ
// between workers running at the same time: it picks their fresh keys. If
// canRemove, the worker removes every fresh key it added before returning,
// so f ends with the keys it started with; else its writes are adds only.
func MixWorker(f Filter, keys *Keys, m Mix, id uint64, canRemove bool, next Nexter, res *MixResult) {
	mask := keys.N - 1
	rng := testrand.Mix(id) | 1
	i := int(testrand.Mix(id+0x51ed)) & mask
	base := uint64(FreshBase) + id<<32
	added := uint64(0) // fresh keys added so far; the next one is base+added, mod Ring
	var writeBelow uint32
	if m.WriteEvery > 0 {
		writeBelow = uint32((1 << 32) / uint64(m.WriteEvery))
	}
	untilWrite := m.WriteEvery // operations to the next write, if not Random
	ring := make([][KeySize]byte, max(m.Live, 1))
	head, held := 0, 0
	ops, hits, falseNeg, refused, removeMiss := 0, 0, 0, 0, 0
	present := false // the last lookup's key set, if not Random
	for next.Next() {
		var write bool
		if m.Random {
			rng ^= rng << 13 // xorshift64
			rng ^= rng >> 7
			rng ^= rng << 17
			r := uint32(rng >> 32)
			write, present = r < writeBelow, r&1 == 0
		} else {
			untilWrite-- // from 0 (no writes) it never comes back to 0
			if write = untilWrite == 0; write {
				untilWrite = m.WriteEvery
			} else {
				present = !present
			}
		}
		switch {
		case write:
			if canRemove && held == len(ring) {
				if !f.Remove(ring[head][:]) {
					removeMiss++
				}
				if head++; head == len(ring) {
					head = 0
				}
				held--
				break
			}
			c := added
			if m.Ring > 0 {
				c &= uint64(m.Ring - 1)
			}
			added++
			k := ring[(head+held)%len(ring)][:]
			PutKey(k, base+c)
			if !f.Add(k) {
				refused++
			} else if canRemove {
				held++
			}
		case present:
			if f.Contains(keys.Present(i & mask)) {
				hits++
			} else {
				falseNeg++
			}
		default:
			if f.Contains(keys.Absent(i & mask)) {
				hits++
			}
		}
		i++
		ops++
	}
	for ; held > 0; held-- {
		if !f.Remove(ring[head][:]) {
			removeMiss++
		}
		if head++; head == len(ring) {
			head = 0
		}
	}
	res.Ops.Add(int64(ops))
	res.Hits.Add(int64(hits))
	res.FalseNegatives.Add(int64(falseNeg))
	res.Refused.Add(int64(refused))
	res.RemoveMisses.Add(int64(removeMiss))
}
