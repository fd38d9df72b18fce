package compare

import (
	"sync/atomic"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// Mix workload: out of every 100 operations, WritePercent are writes and
// the rest lookups, half of a present key and half of an absent one.
const WritePercent = 5

// writeBelow is WritePercent % of 2^32: a write when the random 32 bits are
// below it.
const writeBelow = uint32(WritePercent * (1 << 32) / 100)

// ringSize is how many fresh keys a mix worker keeps added: once its ring
// is full, a write removes the oldest fresh key, else it adds a new one, so
// writes alternate add and remove and every fresh key lives ringSize writes.
const ringSize = 64

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

// MixWorker runs the mix on f until next.Next() is false. id must differ
// between workers running at the same time: it picks their fresh keys. If
// canRemove, the worker removes every fresh key it added before returning,
// so f ends with the keys it started with; else its writes are adds only.
func MixWorker(f Filter, keys *Keys, id uint64, canRemove bool, next Nexter, res *MixResult) {
	mask := keys.N - 1
	rng := testrand.Mix(id) | 1
	i := int(testrand.Mix(id+0x51ed)) & mask
	nextKey := uint64(FreshBase) + id<<32
	var ring [ringSize][KeySize]byte
	head, held := 0, 0
	ops, hits, falseNeg, refused, removeMiss := 0, 0, 0, 0, 0
	for next.Next() {
		rng ^= rng << 13 // xorshift64
		rng ^= rng >> 7
		rng ^= rng << 17
		r := uint32(rng >> 32)
		switch {
		case r < writeBelow:
			if canRemove && held == ringSize {
				if !f.Remove(ring[head][:]) {
					removeMiss++
				}
				head = (head + 1) & (ringSize - 1)
				held--
				break
			}
			k := ring[(head+held)&(ringSize-1)][:]
			PutKey(k, nextKey)
			nextKey++
			if !f.Add(k) {
				refused++
			} else if canRemove {
				held++
			}
		case r&1 == 0:
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
		head = (head + 1) & (ringSize - 1)
	}
	res.Ops.Add(int64(ops))
	res.Hits.Add(int64(hits))
	res.FalseNegatives.Add(int64(falseNeg))
	res.Refused.Add(int64(refused))
	res.RemoveMisses.Add(int64(removeMiss))
}
