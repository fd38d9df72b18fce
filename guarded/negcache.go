package guarded

import (
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// negCache remembers keys that the store did not have, for a while. An
// entry is valid until it expires and only while the insert epoch of its
// key's stripe is the one read before the store was asked: an insert bumps
// the epoch before and after its write, so an entry cached by a lookup
// that raced with the insert is never trusted.
type negCache[K comparable] struct {
	m   *xsync.MapOf[K, negEntry]
	max int
	ttl time.Duration
	now func() time.Time
}

type negEntry struct {
	expires int64 // unix nanoseconds
	epoch   uint64
	gen     uint64 // the Loader's generation: bumped by Invalidate and guard swaps
}

func newNegCache[K comparable](size int, ttl time.Duration, now func() time.Time) *negCache[K] {
	return &negCache[K]{m: xsync.NewMapOf[K, negEntry](), max: size, ttl: ttl, now: now}
}

// has reports whether key is cached as absent under epoch and gen.
func (c *negCache[K]) has(key K, epoch, gen uint64) bool {
	e, ok := c.m.Load(key)
	if !ok {
		return false
	}
	if e.epoch != epoch || e.gen != gen || c.now().UnixNano() >= e.expires {
		c.m.Delete(key)
		return false
	}
	return true
}

// add caches key as absent under epoch. When the cache is full it is
// emptied: a bound, not an LRU, since entries live only for ttl anyway.
func (c *negCache[K]) add(key K, epoch, gen uint64) {
	if c.m.Size() >= c.max {
		c.m.Clear()
	}
	c.m.Store(key, negEntry{expires: c.now().Add(c.ttl).UnixNano(), epoch: epoch, gen: gen})
}
