package guarded

import "sync"

// striped is a map split into stripes by the key's hash, each with its own
// mutex, so that callers of different keys rarely wait for each other. The
// flight of lookups and the per-key write locks are each one.
type striped[K comparable, E any] struct {
	stripes [stripeCount]stripe[K, E]
}

// stripeCount is the number of stripes: enough that 16 cores' writers of
// different keys seldom share one.
const stripeCount = 64

type stripe[K comparable, E any] struct {
	mu sync.Mutex // protects m, and what its owner says it protects
	m  map[K]E    // made at first use
	_  [48]byte   // keeps neighbouring stripes on separate cache lines
}

// of returns the stripe of the key with hash h.
func (s *striped[K, E]) of(h uint64) *stripe[K, E] {
	return &s.stripes[h%stripeCount]
}

// put sets m[key] = e, making the map at first use. The caller holds mu.
func (st *stripe[K, E]) put(key K, e E) {
	if st.m == nil {
		st.m = make(map[K]E)
	}
	st.m[key] = e
}
