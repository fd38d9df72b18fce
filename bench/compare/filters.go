// Package compare compares the guard with peer approximate-membership filters
// on the same keys in the same run. The package holds the filter adapters
// and the key sets; the benchmarks are in compare_test.go and scale_test.go.
//
// Every filter is used through the [Filter] interface, so every one pays
// the same interface call per operation.
package compare

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	bloom "github.com/bits-and-blooms/bloom/v3"
	"github.com/greatroar/blobloom"
	linvon "github.com/linvon/cuckoo-filter"
	panmari "github.com/panmari/cuckoofilter"
	seiflotfy "github.com/seiflotfy/cuckoofilter"
	"github.com/zeebo/xxh3"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// KeySize is the length in bytes of every benchmark key.
const KeySize = 16

// TargetFPR is the false-positive rate the Bloom filter is sized for: about
// the guard's (8·α/2^16 ≈ 1.1e-4 at load 0.9).
const TargetFPR = 1e-4

// Filter is the common face of the compared filters.
type Filter interface {
	// Add adds key and reports whether the filter accepted it.
	Add(key []byte) bool
	// Contains reports whether key might be present.
	Contains(key []byte) bool
	// Remove removes one copy of key and reports whether it was found.
	// It panics for a filter that cannot delete (see [Impl.CanRemove]).
	Remove(key []byte) bool
}

// Impl describes one compared filter.
type Impl struct {
	// Name is the value of the filter=… sub-benchmark key.
	Name string
	// New returns an empty filter sized for n keys.
	New func(n int) Filter
	// BitsPerItem returns the memory of f, in bits, divided by n.
	BitsPerItem func(f Filter, n int) float64
	// CanRemove is false for filters without delete (Bloom).
	CanRemove bool
	// Concurrent is true for filters safe for concurrent use as they are;
	// the others get a sync.RWMutex in the parallel benchmarks.
	Concurrent bool
}

// Impls lists the compared filters, ours first.
//
// Sizing and memory of each:
//
//   - guard: guard.New(WithCapacity(n), WithSeed(1)). Memory is
//     Stats().Bytes (the guard, its shards and their tables), reported as
//     Stats().BitsPerItem with n items.
//   - seiflotfy (8-bit fingerprints, 4 per bucket): NewFilter(c) allocates
//     nextPow2(c)/4 buckets of 4 bytes, i.e. nextPow2(c) slots: at c = n
//     (a power of two) the table would have to be 100 % full, and its
//     inserts fail (a failed insert drops a fingerprint: false negatives).
//     So it is given c = n/DefaultLoadFactor (0.9), the library's own load
//     factor, which gives 2n slots. Memory is the table, len(Encode())
//     bytes (Encode writes one byte per slot).
//   - panmari (16-bit fingerprints, 4 per bucket): NewFilter(n) allocates
//     nextPow2(n/4) buckets, doubled when n would fill them past 96 %, of 8
//     bytes each. Memory is slots × 2 bytes, with slots = Count()/LoadFactor()
//     (both public; LoadFactor is Count / (buckets × 4)).
//   - linvon: NewFilter(4, 16, n, TableTypeSingle): 4 tags per bucket, 16-bit
//     tags, unpacked table, sized for n by the library (power-of-two buckets,
//     doubled past 96 % load). Memory is SizeInBytes(), the table's bytes.
//   - bloom: NewWithEstimates(n, TargetFPR), m bits and k hashes from the
//     textbook formulas. Memory is Cap() = m bits (the bitset rounds m up to
//     64 bits).
//
// The fixed struct headers of the peers (a few words each) are not counted.
var Impls = []Impl{
	{
		Name: "guard",
		New: func(n int) Filter {
			g, err := guard.New(guard.WithCapacity(n), guard.WithSeed(1))
			if err != nil {
				panic(err)
			}
			return guardFilter{g}
		},
		BitsPerItem: func(f Filter, n int) float64 {
			// Stats().BitsPerItem is 8·Stats().Bytes / Items; the filter
			// is measured holding n keys, so Items = n.
			_ = n
			return f.(guardFilter).g.Stats().BitsPerItem
		},
		CanRemove:  true,
		Concurrent: true,
	},
	{
		Name: "seiflotfy",
		New: func(n int) Filter {
			return seiflotfyFilter{seiflotfy.NewFilter(uint(float64(n) / seiflotfy.DefaultLoadFactor))}
		},
		BitsPerItem: func(f Filter, n int) float64 {
			return 8 * float64(len(f.(seiflotfyFilter).f.Encode())) / float64(n)
		},
		CanRemove: true,
	},
	{
		Name: "panmari",
		New: func(n int) Filter {
			return panmariFilter{panmari.NewFilter(uint(n))}
		},
		BitsPerItem: func(f Filter, n int) float64 {
			p := f.(panmariFilter).f
			slots := float64(p.Count()) / p.LoadFactor()
			return 16 * slots / float64(n)
		},
		CanRemove: true,
	},
	{
		Name: "linvon",
		New: func(n int) Filter {
			return linvonFilter{linvon.NewFilter(4, 16, uint(n), linvon.TableTypeSingle)}
		},
		BitsPerItem: func(f Filter, n int) float64 {
			return 8 * float64(f.(linvonFilter).f.SizeInBytes()) / float64(n)
		},
		CanRemove: true,
	},
	{
		Name: "bloom",
		New: func(n int) Filter {
			return bloomFilter{bloom.NewWithEstimates(uint(n), TargetFPR)}
		},
		BitsPerItem: func(f Filter, n int) float64 {
			return float64(f.(bloomFilter).f.Cap()) / float64(n)
		},
	},
	{
		Name: "blobloom",
		New: func(n int) Filter {
			bits, hashes := blobloom.Optimize(blobloom.Config{Capacity: uint64(n), FPRate: TargetFPR})
			return blobloomFilter{f: blobloom.NewSync(bits, hashes), bits: bits}
		},
		BitsPerItem: func(f Filter, n int) float64 {
			return float64(f.(blobloomFilter).bits) / float64(n)
		},
		Concurrent: true,
	},
	{
		Name: "panmari256",
		New: func(n int) Filter {
			s := new(shardedPanmari)
			for i := range s.parts {
				s.parts[i].f = panmari.NewFilter(uint(max(n/len(s.parts), 1)))
			}
			return s
		},
		BitsPerItem: func(f Filter, n int) float64 {
			slots := 0.0
			for i := range f.(*shardedPanmari).parts {
				p := f.(*shardedPanmari).parts[i].f
				slots += float64(p.Count()) / p.LoadFactor()
			}
			return 16 * slots / float64(n)
		},
		CanRemove:  true,
		Concurrent: true,
	},
}

type guardFilter struct{ g *guard.Guard }

func (f guardFilter) Add(k []byte) bool      { return f.g.Add(k) == nil }
func (f guardFilter) Contains(k []byte) bool { return f.g.Contains(k) }
func (f guardFilter) Remove(k []byte) bool   { return f.g.Remove(k) }

type seiflotfyFilter struct{ f *seiflotfy.Filter }

func (f seiflotfyFilter) Add(k []byte) bool      { return f.f.Insert(k) }
func (f seiflotfyFilter) Contains(k []byte) bool { return f.f.Lookup(k) }
func (f seiflotfyFilter) Remove(k []byte) bool   { return f.f.Delete(k) }

type panmariFilter struct{ f *panmari.Filter }

func (f panmariFilter) Add(k []byte) bool      { return f.f.Insert(k) }
func (f panmariFilter) Contains(k []byte) bool { return f.f.Lookup(k) }
func (f panmariFilter) Remove(k []byte) bool   { return f.f.Delete(k) }

type linvonFilter struct{ f *linvon.Filter }

func (f linvonFilter) Add(k []byte) bool      { return f.f.Add(k) }
func (f linvonFilter) Contains(k []byte) bool { return f.f.Contain(k) }
func (f linvonFilter) Remove(k []byte) bool   { return f.f.Delete(k) }

type bloomFilter struct{ f *bloom.BloomFilter }

func (f bloomFilter) Add(k []byte) bool      { f.f.Add(k); return true }
func (f bloomFilter) Contains(k []byte) bool { return f.f.Test(k) }
func (f bloomFilter) Remove([]byte) bool     { panic("bloom: cannot remove") }

// blobloomFilter is greatroar/blobloom's SyncFilter: a blocked Bloom filter
// whose adds and lookups are lock-free. It takes a 64-bit hash of the key
// (xxh3, as the guard uses) and cannot remove.
type blobloomFilter struct {
	f    *blobloom.SyncFilter
	bits uint64
}

func (f blobloomFilter) Add(k []byte) bool      { f.f.Add(xxh3.Hash(k)); return true }
func (f blobloomFilter) Contains(k []byte) bool { return f.f.Has(xxh3.Hash(k)) }
func (f blobloomFilter) Remove([]byte) bool     { panic("blobloom: cannot remove") }

// shardedPanmari is what users build by hand for concurrency: 256 panmari
// filters, each behind its own sync.RWMutex, a key's filter picked by the
// top byte of its xxh3 hash.
type shardedPanmari struct {
	parts [256]struct {
		mu sync.RWMutex
		f  *panmari.Filter
		_  [40]byte // one part per cache line pair: no false sharing of locks
	}
}

func (s *shardedPanmari) part(k []byte) (*sync.RWMutex, *panmari.Filter) {
	p := &s.parts[xxh3.Hash(k)>>56]
	return &p.mu, p.f
}

func (s *shardedPanmari) Add(k []byte) bool {
	mu, f := s.part(k)
	mu.Lock()
	defer mu.Unlock()
	return f.Insert(k)
}

func (s *shardedPanmari) Contains(k []byte) bool {
	mu, f := s.part(k)
	mu.RLock()
	defer mu.RUnlock()
	return f.Lookup(k)
}

func (s *shardedPanmari) Remove(k []byte) bool {
	mu, f := s.part(k)
	mu.Lock()
	defer mu.Unlock()
	return f.Delete(k)
}

// Locked wraps a filter that is not safe for concurrent use: lookups take
// the read lock, adds and removes the write lock.
type Locked struct {
	mu sync.RWMutex
	f  Filter
}

// NewLocked returns f behind a sync.RWMutex.
func NewLocked(f Filter) *Locked { return &Locked{f: f} }

// Add adds key under the write lock.
func (l *Locked) Add(k []byte) bool {
	l.mu.Lock()
	ok := l.f.Add(k)
	l.mu.Unlock()
	return ok
}

// Contains looks key up under the read lock.
func (l *Locked) Contains(k []byte) bool {
	l.mu.RLock()
	ok := l.f.Contains(k)
	l.mu.RUnlock()
	return ok
}

// Remove removes key under the write lock.
func (l *Locked) Remove(k []byte) bool {
	l.mu.Lock()
	ok := l.f.Remove(k)
	l.mu.Unlock()
	return ok
}

// Key domains: the counters that keys are made from. Present, absent and
// fresh keys never share a counter, so they never share a key.
const (
	presentBase = 0
	absentBase  = 1 << 40
	// FreshBase is where the counters of keys made during a benchmark
	// (added, then removed) start.
	FreshBase = 1 << 41
)

// PutKey writes the 16-byte key of counter c into dst[:KeySize]. Its first
// 8 bytes are a bijection of c, so distinct counters give distinct keys.
func PutKey(dst []byte, c uint64) {
	binary.LittleEndian.PutUint64(dst[0:8], testrand.Mix(c))
	binary.LittleEndian.PutUint64(dst[8:16], testrand.Mix(c^0x9e3779b97f4a7c15))
}

// Keys holds n present keys (to be added) and n absent keys (never added),
// each packed KeySize bytes apart in one slice.
type Keys struct {
	N       int
	present []byte
	absent  []byte
}

// Present returns present key i, 0 ≤ i < N.
func (k *Keys) Present(i int) []byte {
	return k.present[i*KeySize : i*KeySize+KeySize : i*KeySize+KeySize]
}

// Absent returns absent key i, 0 ≤ i < N.
func (k *Keys) Absent(i int) []byte {
	return k.absent[i*KeySize : i*KeySize+KeySize : i*KeySize+KeySize]
}

// NewKeys makes the key set for n, on every CPU.
func NewKeys(n int) *Keys {
	k := &Keys{N: n, present: make([]byte, n*KeySize), absent: make([]byte, n*KeySize)}
	inParallel(n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			PutKey(k.present[i*KeySize:], presentBase+uint64(i))
			PutKey(k.absent[i*KeySize:], absentBase+uint64(i))
		}
	})
	return k
}

// Fill adds keys' present keys to f, and returns an error if one is
// refused. A filter safe for concurrent use is filled from every CPU at
// once, in ranges of keys (see inParallel), the others in key order.
func Fill(f Filter, keys *Keys) error {
	add := func(lo, hi int) error {
		for i := lo; i < hi; i++ {
			if !f.Add(keys.Present(i)) {
				return fmt.Errorf("add of present key %d of %d refused", i, keys.N)
			}
		}
		return nil
	}
	if _, ok := f.(concurrent); !ok {
		return add(0, keys.N)
	}
	var mu sync.Mutex
	var first error
	inParallel(keys.N, func(lo, hi int) {
		if err := add(lo, hi); err != nil {
			mu.Lock()
			first = cmp.Or(first, err)
			mu.Unlock()
		}
	})
	return first
}

// FalseNegatives returns how many of keys' present keys f reports absent,
// looking them up from every CPU if f is safe for concurrent use.
func FalseNegatives(f Filter, keys *Keys) int {
	miss := func(lo, hi int) int {
		m := 0
		for i := lo; i < hi; i++ {
			if !f.Contains(keys.Present(i)) {
				m++
			}
		}
		return m
	}
	if _, ok := f.(concurrent); !ok {
		return miss(0, keys.N)
	}
	var total atomic.Int64
	inParallel(keys.N, func(lo, hi int) { total.Add(int64(miss(lo, hi))) })
	return int(total.Load())
}

// MeasureFPR returns the fraction of the first min(m, keys.N) absent keys
// that f reports present.
func MeasureFPR(f Filter, keys *Keys, m int) float64 {
	m = min(m, keys.N)
	hits := 0
	for i := range m {
		if f.Contains(keys.Absent(i)) {
			hits++
		}
	}
	return float64(hits) / float64(m)
}
