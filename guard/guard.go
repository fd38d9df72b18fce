package guard

import (
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/puzpuzpuz/xsync/v3"
	"github.com/zeebo/xxh3"

	"github.com/cuckooguard/cuckooguard/internal/memsize"
	"github.com/cuckooguard/cuckooguard/internal/options"
	"github.com/cuckooguard/cuckooguard/internal/owner"
	"github.com/cuckooguard/cuckooguard/resize"
	"github.com/cuckooguard/cuckooguard/shard"
)

// Guard is an approximate set of keys: [Guard.Contains] never reports false
// for a key that was added and not removed, and reports true for an absent
// key with a small probability (see the package documentation).
//
// Use [New] to make a Guard; the zero Guard is not usable. A Guard is safe
// for concurrent use by multiple goroutines and must not be copied after
// first use.
type Guard struct {
	// Read-only after New: everything a lookup needs.
	shards []shard.Shard
	lay    layout
	seed   uint64

	cfg    config          // what the guard was made with; a rebuild starts from it
	growth *shard.Growth   // the shards' growth policy: threshold, memory cap
	rs     *resize.Resizer // doubles shards in the background; stopped by Close
	closed atomic.Bool
	owned  atomic.Bool // claimed by a wrapper that closes it (internal/owner)
	// restored is the number of keys Restore read, which the shards count
	// as inserts; Stats' Adds leaves them out. Set before the guard is
	// shared.
	restored uint64

	// Adds and removes are counted by the shards, on the cache line that
	// their writers hold anyway (see shard.Stats); a counter of the
	// guard's own would be one more line that every write moves between
	// cores. The rare outcomes are counted here.
	failures   *xsync.Counter
	dupRefused *xsync.Counter

	// degraded has bit i%64 of word i/64 set once shard i refused an add
	// with ErrFull, or its owner marked it (see Degraded). Snapshots keep
	// it.
	degraded []atomic.Uint64
}

// New returns an empty Guard configured by opts. It returns an error, and
// no Guard, if an option is invalid.
func New(opts ...Option) (*Guard, error) {
	c := defaultConfig()
	if err := options.Apply("guard: New", &c, opts); err != nil {
		return nil, err
	}
	return newGuard(c)
}

// newGuard returns an empty Guard configured by c.
func newGuard(c config) (*Guard, error) {
	growth, err := c.validate()
	if err != nil {
		return nil, err
	}
	lay, err := plan(c.capacity, c.shards, c.growThreshold, concurrencyShards())
	if err != nil {
		return nil, err
	}
	if c.maxBytes != 0 && fixedBytes(lay)+lay.reserved() > c.maxBytes {
		// The shards plan adds for concurrency do not fit under the cap:
		// the leanest layout may (Fresh sizes a capped guard's
		// replacement by it, capacityWithin).
		if l, err := leanestPlan(c.capacity, c.shards, c.growThreshold); err == nil {
			lay = l
		}
	}
	return newGuardLayout(c, growth, lay)
}

// newGuardLayout returns an empty Guard configured by c whose shards are
// laid out as lay, under growth policy growth (which c.validate returned).
func newGuardLayout(c config, growth *shard.Growth, lay layout) (*Guard, error) {
	if !c.seedSet {
		c.seed = rand.Uint64()
	}
	g := newGuardValue(lay, c.seed)
	for i := range g.shards {
		if err := g.shards[i].Init(lay.logs[i]); err != nil {
			return nil, err
		}
	}
	if err := g.start(c, growth); err != nil {
		return nil, err
	}
	return g, nil
}

func init() {
	owner.Claim = func(g any) bool { return g.(*Guard).owned.CompareAndSwap(false, true) }
}

// newGuardValue returns a Guard with the shards of lay, not yet
// initialized, and its counters.
func newGuardValue(lay layout, seed uint64) *Guard {
	return &Guard{
		shards:     make([]shard.Shard, len(lay.logs)),
		lay:        lay,
		seed:       seed,
		failures:   xsync.NewCounter(),
		dupRefused: xsync.NewCounter(),
		degraded:   make([]atomic.Uint64, degradedWords(len(lay.logs))),
	}
}

// degradedWords is the length of the degraded bitmap of n shards.
func degradedWords(n int) int {
	return (n + 63) / 64
}

// start puts the guard's shards under its growth policy, which reserves
// what the guard holds against the memory cap, and makes its Resizer. It
// is the last step of New and Restore.
func (g *Guard) start(c config, growth *shard.Growth) error {
	c.seed, c.seedSet = g.seed, true
	g.cfg = c
	if need := g.reserved(); c.maxBytes != 0 && c.maxBytes < need {
		return fmt.Errorf("guard: memory cap %d bytes is below the %d bytes the guard needs (with room for its shards' stashes)", c.maxBytes, need)
	}
	if err := growth.Reserve(int64(fixedBytes(g.lay))); err != nil {
		return err
	}
	for i := range g.shards {
		if err := g.shards[i].SetGrowth(growth); err != nil {
			return err
		}
	}
	// A large guard's lookups miss the TLB: ask for huge pages (see
	// shard.HugePagesMin; a smaller guard's doublings ask once it is large).
	if growth.UsedBytes() >= shard.HugePagesMin {
		for i := range g.shards {
			g.shards[i].AdviseHugePages()
		}
	}
	g.growth = growth
	var ropts []resize.Option
	if c.workersSet {
		ropts = append(ropts, resize.WithWorkers(c.workers))
	}
	rs, err := resize.New(ropts...)
	if err != nil {
		return err
	}
	g.rs = rs
	return nil
}

// reserved returns the memory that the guard's growth policy reserves
// for it (see shard.Shard.ReservedBytes): what Stats counts as Bytes, with
// room for every shard's stash, full.
func (g *Guard) reserved() int {
	n := fixedBytes(g.lay)
	for i := range g.shards {
		n += g.shards[i].ReservedBytes()
	}
	return n
}

// route cuts a key hash into its shard, fingerprint and position, as laid
// out in the package documentation.
func (g *Guard) route(h uint64) (s *shard.Shard, f uint8, v uint64) {
	return &g.shards[g.shardOf(h)], fingerprint(h), h
}

// fingerprint returns the fingerprint of hash h: its byte above the
// routing bits, 0 made 1 (a shard never stores 0).
func fingerprint(h uint64) uint8 {
	return max(uint8(h>>routeBits), 1)
}

// shardOf returns the index of the shard that hash h routes to.
func (g *Guard) shardOf(h uint64) uint64 {
	return g.lay.shardIndex(h & (1<<routeBits - 1))
}

// ShardIndex returns the index, in [0, Shards()), of the shard that the
// key with hash h belongs to, so that a caller can treat the keys of one
// shard that refused an add differently from the rest.
func (g *Guard) ShardIndex(h uint64) int {
	return int(g.shardOf(h))
}

// Shards returns the number of shards.
func (g *Guard) Shards() int {
	return len(g.shards)
}

// Hash returns the 64-bit hash that [Guard.Add], [Guard.Contains] and
// [Guard.Remove] compute for key: xxh3 with the guard's seed.
func (g *Guard) Hash(key []byte) uint64 {
	return xxh3.HashSeed(key, g.seed)
}

// HashString returns the hash of key as [Guard.Hash] does, without copying
// the string.
func (g *Guard) HashString(key string) uint64 {
	return xxh3.HashStringSeed(key, g.seed)
}

// Contains reports whether key might be in the set. If true, the result
// might be a false positive. If false, the key is definitely not in the
// set: it was never added, or it was removed. Contains takes no lock and
// does not allocate. The empty key is a valid key.
func (g *Guard) Contains(key []byte) bool {
	return g.ContainsHash(xxh3.HashSeed(key, g.seed))
}

// ContainsString is [Guard.Contains] for a string key, without copying it.
func (g *Guard) ContainsString(key string) bool {
	return g.ContainsHash(xxh3.HashStringSeed(key, g.seed))
}

// ContainsHash is [Guard.Contains] for a key hashed by the caller (see the
// hash layout in the package documentation).
func (g *Guard) ContainsHash(h uint64) bool {
	s, f, v := g.route(h)
	return s.Contains(f, v)
}

// Add adds one copy of key to the set; the key is present from the moment
// Add returns until it is removed. Add returns [ErrTooManyCopies] if the
// set holds [MaxCopies] copies of the key already (the key is present; the
// set is unchanged), [ErrFull] if the key's shard cannot take it (the
// memory cap of [WithMaxBytes] is reached, or keys that collide on every
// bit the shard compares crowd the key's buckets), and [ErrClosed] after
// [Guard.Close].
//
// The set counts copies: adding a key twice and removing it once leaves it
// present. Keep one copy per stored key.
//
// If the key's shard reaches the grow threshold, Add queues it for a
// background doubling. If the shard has no room at all, Add doubles it
// before returning (or helps finish the doubling in progress); lookups
// never wait for either. A shard can double until its table has 2^40
// buckets; memory runs out long before.
func (g *Guard) Add(key []byte) error {
	return g.AddHash(xxh3.HashSeed(key, g.seed))
}

// AddString is [Guard.Add] for a string key, without copying it.
func (g *Guard) AddString(key string) error {
	return g.AddHash(xxh3.HashStringSeed(key, g.seed))
}

// AddHash is [Guard.Add] for a key hashed by the caller.
func (g *Guard) AddHash(h uint64) error {
	if g.closed.Load() {
		return ErrClosed
	}
	s, f, v := g.route(h)
	// The shard doubles itself if it has no room (see shard.Growth).
	if err := s.Insert(f, v); err != nil {
		if errors.Is(err, ErrTooManyCopies) {
			g.dupRefused.Inc()
		} else {
			g.failures.Inc() // ErrFull, wrapped with the reason
			g.MarkDegraded(int(g.shardOf(h)))
		}
		return err
	}
	// Queue a background doubling at the grow threshold. GrowthDue is a
	// hint on a line that writers rarely write; NeedsGrowth, which Maybe
	// asks, reads every counter stripe of the shard, which other cores
	// write, so it is asked only when the hint says so.
	if s.GrowthDue() {
		g.rs.Maybe(s)
	}
	return nil
}

// Degraded reports whether shard i, in [0, Shards()), refused a key with
// [ErrFull] (see [Guard.ShardIndex]) or was marked with
// [Guard.MarkDegraded]: the guard answers for the keys it holds, but an
// owner that keeps such a key elsewhere, and so must pass the shard's
// lookups through to its store (package guarded's Loader does), needs to
// know. The mark lasts for the guard's life and travels with its
// snapshots (see [Guard.WriteTo]); a guard built afresh has none. It
// reports false for an index out of range.
func (g *Guard) Degraded(i int) bool {
	if i < 0 || i >= len(g.shards) {
		return false
	}
	return g.degraded[i/64].Load()&(1<<(i%64)) != 0
}

// MarkDegraded marks shard i as [Guard.Degraded]: for an owner whose
// lookups of the shard pass through for a reason the guard cannot see,
// so that a snapshot, restored, says so too. It does nothing for an index
// out of range.
func (g *Guard) MarkDegraded(i int) {
	if i >= 0 && i < len(g.shards) {
		g.degraded[i/64].Or(1 << (i % 64))
	}
}

// Remove removes one copy of key and reports whether the set held one.
// Remove only keys that were added: removing a key that was never added
// can remove another key that shares its fingerprint and buckets, and
// that key would then read absent (a false negative).
func (g *Guard) Remove(key []byte) bool {
	return g.RemoveHash(xxh3.HashSeed(key, g.seed))
}

// RemoveString is [Guard.Remove] for a string key, without copying it.
func (g *Guard) RemoveString(key string) bool {
	return g.RemoveHash(xxh3.HashStringSeed(key, g.seed))
}

// RemoveHash is [Guard.Remove] for a key hashed by the caller.
func (g *Guard) RemoveHash(h uint64) bool {
	s, f, v := g.route(h)
	return s.Delete(f, v)
}

// Len returns the number of keys in the set, counting copies. It visits
// every shard without locking, so it does not necessarily correspond to
// any consistent snapshot of the set while writers run.
func (g *Guard) Len() int {
	n := 0
	for i := range g.shards {
		n += g.shards[i].Len()
	}
	return n
}

// Seed returns the seed of the guard's key hash.
func (g *Guard) Seed() uint64 {
	return g.seed
}

// Close stops the guard's background doublings and waits for them to
// return. Afterwards adds return [ErrClosed]; lookups and removes keep
// working, also on a shard whose doubling Close interrupted. Close is
// idempotent, safe to call concurrently, and always returns nil.
func (g *Guard) Close() error {
	g.closed.Store(true)
	return g.rs.Close()
}

// Closed reports whether [Guard.Close] has been called: adds then return
// [ErrClosed].
func (g *Guard) Closed() bool {
	return g.closed.Load()
}

// guardBytes is the memory of a Guard value.
const guardBytes = int(unsafe.Sizeof(Guard{}))

// resizerBytes is the heap memory of an idle Resizer: the struct, its
// context, semaphore and map, 338 bytes measured with runtime.MemStats
// over 1,000 of them, rounded up (TestStatsBytesMatchHeap holds the sum).
// An idle Resizer runs no goroutine.
const resizerBytes = 352

// fixedBytes returns the heap memory of a guard laid out as l besides its
// shards' own figures: the Guard, what the allocator rounds its slice of
// shards up by, the layout's slices, the degraded bitmap, its two
// counters, its growth policy and its resizer.
func fixedBytes(l layout) int {
	shardsBytes := len(l.logs) * int(unsafe.Sizeof(shard.Shard{}))
	return memsize.Of(guardBytes, true) +
		memsize.Of(int(unsafe.Sizeof(shard.Growth{})), false) +
		memsize.Of(shardsBytes, true) - shardsBytes +
		memsize.Of(8*cap(l.logs), false) + memsize.Of(4*cap(l.bounds), false) +
		memsize.Of(8*degradedWords(len(l.logs)), false) +
		2*counterBytes() +
		resizerBytes
}

// counterBytes returns the memory of one xsync.Counter: a 32-byte header
// and one 64-byte stripe per core, rounded up to a power of two
// (xsync/v3's counter.go).
func counterBytes() int {
	n := min(runtime.GOMAXPROCS(0), runtime.NumCPU())
	return memsize.Of(32, true) + memsize.Of(64*(1<<bits.Len(uint(n-1))), false)
}
