package guard

import (
	"fmt"

	"github.com/cuckooguard/cuckooguard/internal/options"
)

// Fresh returns a new, empty guard configured like g, for capacity keys:
// it has g's memory cap, shard count (if g's was set with [WithShards]),
// grow threshold, grow workers and seed, so that a key hashes alike in
// both; opts apply on top. It is how a guard is rebuilt: the
// configuration travels with the guard, and a rebuild need not repeat it.
//
// Under a memory cap, Fresh sizes the guard for as many of the capacity
// keys as fit, and returns an error wrapping [ErrFull] if that is fewer
// than g holds now ([Guard.Len]): such a replacement could not take g's
// keys.
func (g *Guard) Fresh(capacity int, opts ...Option) (*Guard, error) {
	c := g.cfg
	c.capacity = capacity
	if err := options.Apply("guard: Fresh", &c, opts); err != nil {
		return nil, err
	}
	if c.maxBytes != 0 {
		if _, err := c.validate(); err != nil {
			return nil, err
		}
		fit := capacityWithin(c)
		if keys := g.Len(); fit < keys {
			return nil, fmt.Errorf("%w: the memory cap of %d bytes holds about %d keys; the guard has %d", ErrFull, c.maxBytes, fit, keys)
		}
		c.capacity = min(c.capacity, fit)
	}
	return newGuard(c)
}

// Capacity returns the number of keys g was sized for ([WithCapacity]).
// A guard takes more keys than that by growing.
func (g *Guard) Capacity() int {
	return g.cfg.capacity
}
