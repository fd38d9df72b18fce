package guard

import (
	"fmt"

	"github.com/cuckooguard/cuckooguard/shard"
)

// Defaults and limits of the options.
const (
	// DefaultCapacity is the capacity of a Guard made without WithCapacity:
	// about 160 KiB, growing on demand as far as memory allows.
	DefaultCapacity = 1 << 16
	// MaxShards is the largest shard count WithShards accepts.
	MaxShards = 1 << 16
	// DefaultGrowThreshold is the load factor at which a shard doubles.
	DefaultGrowThreshold = shard.DefaultGrowThreshold
	// MaxCopies is the number of copies of one key a guard keeps; more
	// adds of it return ErrTooManyCopies.
	MaxCopies = shard.MaxCopies
)

// Option configures a Guard made by [New] or restored from a snapshot.
type Option func(*config)

type config struct {
	capacity      int
	shards        int
	shardsSet     bool // else the count is chosen from capacity
	seed          uint64
	seedSet       bool
	growThreshold float64
	maxBytes      int // 0: no cap
	workers       int
	workersSet    bool // else resize.DefaultWorkers()
}

func defaultConfig() config {
	return config{capacity: DefaultCapacity, growThreshold: DefaultGrowThreshold}
}

// Like gives the guard the grow threshold, the memory cap and the grow
// workers of g, not its capacity, shards or seed. With [Restore] it makes
// a guard saved earlier behave like the one it replaces:
//
//	restored, err := guard.Restore(f, guard.Like(current))
//
// Options after it override what it sets. A nil g sets nothing.
func Like(g *Guard) Option {
	return func(c *config) {
		if g == nil {
			return
		}
		c.growThreshold = g.cfg.growThreshold
		c.maxBytes = g.cfg.maxBytes
		c.workers, c.workersSet = g.cfg.workers, g.cfg.workersSet
	}
}

// WithCapacity sets the number of keys the guard is expected to hold. It
// sizes the shards so that, filled to n keys, the guard uses at most about
// 20 bits (2.5 bytes) per key and no shard has had to double. More keys are
// accepted: shards double as they fill, as often as needed.
// n must be at least 1; the default is [DefaultCapacity].
func WithCapacity(n int) Option {
	return func(c *config) { c.capacity = n }
}

// WithShards sets the number of independently locked shards, in
// [1, MaxShards]; it need not be a power of two. More shards let more
// writers run in parallel and keep each doubling short; each shard costs
// about 320 bytes besides its table. A guard keeps its shards as it grows.
// By default the count is chosen from the capacity to waste the least
// memory (a guard of 1,000,000 keys gets about 70), and raised to 4 per
// core (GOMAXPROCS, at most 256) where that fits in 64 KiB or in 20 bits
// per declared key.
func WithShards(n int) Option {
	return func(c *config) { c.shards, c.shardsSet = n, true }
}

// WithSeed sets the seed of the key hash. By default every Guard gets a
// random seed, so that an attacker who chooses keys cannot aim them at one
// bucket or make them collide in every process. Set a seed to get the same
// layout in several processes or runs; a snapshot records its seed.
func WithSeed(seed uint64) Option {
	return func(c *config) { c.seed, c.seedSet = seed, true }
}

// WithGrowThreshold sets the load factor, in [0.5, 0.95], at which a shard
// doubles. Lower values grow earlier and keep inserts fast; higher values
// use memory better. The default is [DefaultGrowThreshold]. A shard that
// cannot place a key doubles whatever its load.
func WithGrowThreshold(load float64) Option {
	return func(c *config) { c.growThreshold = load }
}

// WithMaxBytes caps the guard's memory at n bytes: [Stats].Bytes, all the
// guard holds on the heap (its shards, their tables, both of a shard while
// it doubles, and stashes, its counters and its resizer), never passes n.
// The cap counts each table with room for a full stash ([Stats].ReservedBytes,
// about 56 bytes a shard more than an empty stash takes), because a stash
// fills as its table does. A doubling that would pass the cap is refused;
// the shard keeps filling until it is full, and then [Guard.Add] returns
// an error that [errors.Is] [ErrFull]. n must be at least what the new
// guard reserves ([Stats].ReservedBytes of a guard made without the cap);
// [New] and [Restore] return an error that names that figure for less. By
// default there is no cap.
func WithMaxBytes(n int) Option {
	return func(c *config) { c.maxBytes = n }
}

// WithGrowWorkers sets how many shards may double in the background at the
// same time, at least 1. The default is one per 4 cores (GOMAXPROCS), at
// least 1.
func WithGrowWorkers(n int) Option {
	return func(c *config) { c.workers, c.workersSet = n, true }
}

// validate checks c and returns the growth policy it describes, which
// checks the grow threshold and the memory cap.
func (c *config) validate() (*shard.Growth, error) {
	if c.capacity < 1 {
		return nil, fmt.Errorf("guard: capacity %d must be at least 1", c.capacity)
	}
	if c.capacity > MaxCapacity {
		return nil, fmt.Errorf("guard: capacity %d exceeds the maximum %d", c.capacity, MaxCapacity)
	}
	if c.shardsSet && (c.shards < 1 || c.shards > MaxShards) {
		return nil, fmt.Errorf("guard: shard count %d out of range [1, %d]", c.shards, MaxShards)
	}
	if c.workersSet && c.workers < 1 {
		return nil, fmt.Errorf("guard: grow workers %d must be at least 1", c.workers)
	}
	g, err := shard.NewGrowth(c.growThreshold, int64(c.maxBytes))
	if err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	return g, nil
}
