package guard

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// Loader wraps a store lookup with a guard: [Loader.Get] answers
// [ErrNotFound] for keys the guard knows are absent without calling the
// store, and coalesces concurrent lookups of the same key. [Loader.Insert]
// and [Loader.Delete] keep the guard in step with the store's writes.
//
// # Keeping the promise of no false negatives
//
// A cuckoo filter may only remove a copy of a key that it holds: removing a
// key it does not hold can remove the copy of another key that shares its
// fingerprint and bucket, and that key then reads absent. The Loader keeps
// one rule on every path: each creation of a row adds one copy of its key
// before any reader can see the row, and a copy is removed only by a
// deletion that is known to follow the creation whose copy it removes.
//
//   - Warm-up. Until the guard holds every key of the store, the Loader
//     passes every lookup through: after [Loader.Fill] (a fresh guard),
//     [Loader.CatchUp] (a guard restored from a snapshot) or
//     [Loader.MarkReady] (a guard the caller filled).
//   - Insert adds the key to the guard before the write, so no reader can
//     see the row before the guard has the key. It takes the key out again
//     only if the write certainly wrote nothing ([WithRollback]); a write
//     whose outcome is unknown (a cancelled context, a lost connection,
//     [ErrMaybeWritten]) keeps it, a possible false positive. Concurrent
//     Inserts of one key run one after the other, so a retried or
//     duplicated request cannot pile up copies.
//   - Delete removes the key only after the store confirmed it deleted an
//     existing row, and only if the Loader was ready when the Delete began:
//     a guard that is still warming up may not hold the key yet (Fill may
//     not have read it), and removing it there could take another key's
//     copy. A Delete during warm-up leaves a copy behind: a false positive
//     until the next rebuild.
//   - CatchUp applies every change since a snapshot, this process's own
//     deletes included, exactly once: Deletes made while the Loader catches
//     up do not remove anything themselves.
//   - With a change feed ([Loader.AttachFeed], used by the postgres
//     follower), Delete removes nothing: the feed applies every committed
//     delete, this process's own included, in commit order, after the
//     creation it undoes. Inserts are still added by Insert, and the feed
//     skips this process's own.
//   - A shard that cannot take a key ([ErrFull]) passes its lookups through
//     from then on, and the Loader builds a fresh guard in the background
//     and swaps it in: from the key source ([WithKeySource]), or through
//     the feed's snapshot-aware resync when a feed is attached. It does the
//     same when the guard's estimated false-positive rate passes
//     [WithMaxFPR]. Inserts during a rebuild reach both guards; deletes
//     reach only the current one, so the new guard may keep a few deleted
//     keys (false positives, never false negatives).
//
// A Loader is safe for concurrent use by multiple goroutines. It owns the
// guard it was given and closes it in [Loader.Close]; a guard can have at
// most one Loader.
type Loader[K comparable, V any] struct {
	lookup func(ctx context.Context, key K) (V, error)
	batch  func(ctx context.Context, keys []K) (map[K]V, error) // nil: one lookup per key
	codec  keyCodec[K]
	source func(ctx context.Context) iter.Seq2[K, error]
	cfg    loaderConfig

	cur    atomic.Pointer[view] // the guard lookups use
	shadow atomic.Pointer[view] // the guard a rebuild fills, or nil
	// writeMu orders writes against the start and the end of a rebuild:
	// an insert holds it shared from its guard add to the end of its
	// write, so that the rebuild, which takes it exclusively, sees every
	// insert either finished (in the store, for the key source to read) or
	// not begun (and so reaching the new guard too). A delete holds it so
	// that the guard it removes from is the one it found ready.
	writeMu sync.RWMutex
	ready   atomic.Bool
	feed    atomic.Pointer[feedHook] // set once by AttachFeed

	flight  flight[K, V] // coalesces store lookups
	inserts keyLocks[K]  // one Insert per key at a time
	neg     *negCache[K]
	epochs  [256]atomic.Uint64 // bumped by inserts, by key hash: invalidate negative entries
	negGen  atomic.Uint64      // bumped by Invalidate and guard swaps: invalidates them all

	mu           sync.Mutex // protects closed, wg.Add and rebuildDelay
	closed       bool
	rebuildDelay time.Duration // backoff after failed rebuilds
	rebuildAfter atomic.Int64  // unix nanoseconds before which no rebuild starts
	ctx          context.Context
	cancel       context.CancelFunc
	wg           sync.WaitGroup // rebuild goroutines
	rebuilding   atomic.Bool
	rebuildMu    sync.Mutex // held while a rebuild or resync builds a guard
	closeOnce    sync.Once

	insertN atomic.Uint64 // inserts, to check the FPR every 4096

	storeCalls, avoided, falsePos, negHits, passed, letThrough *xsync.Counter
	rebuilds, rebuildErrs, batchCalls                          *xsync.Counter
}

// view is one guard with the shards whose lookups must pass through.
type view struct {
	g       *Guard
	pass    []atomic.Bool // per shard: it refused a key (ErrFull), which may be missing
	passAny atomic.Bool
}

func newView(g *Guard) *view {
	return &view{g: g, pass: make([]atomic.Bool, g.Shards())}
}

// passes reports whether lookups of hash h must reach the store because
// h's shard could not take every key.
func (v *view) passes(h uint64) bool {
	return v.passAny.Load() && v.pass[v.g.ShardIndex(h)].Load()
}

// NewLoader returns a Loader that guards lookup with g and takes ownership
// of g: [Loader.Close] closes it. The Loader passes every lookup through
// until it is ready (see [Loader]). It returns an error for invalid
// options, a key type that needs [WithKeyBytes], or a guard that another
// Loader owns already.
func NewLoader[K comparable, V any](g *Guard, lookup func(ctx context.Context, key K) (V, error), opts ...LoaderOption) (*Loader[K, V], error) {
	c := loaderConfig{
		isNotFound:  defaultIsNotFound,
		notWritten:  NotWritten,
		maxFPR:      DefaultMaxFPR,
		loadTimeout: DefaultLoadTimeout,
		fillWorkers: runtime.GOMAXPROCS(0),
		logger:      discardLogger,
		now:         time.Now,
	}
	for _, o := range opts {
		o(&c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if g == nil || lookup == nil {
		return nil, errors.New("guard: NewLoader needs a guard and a lookup function")
	}
	var custom func(K) []byte
	if c.keyBytes != nil {
		f, ok := c.keyBytes.(func(K) []byte)
		if !ok {
			return nil, fmt.Errorf("guard: WithKeyBytes is for %T, not for keys of type %T", c.keyBytes, *new(K))
		}
		custom = f
	}
	codec, err := newKeyCodec(custom)
	if err != nil {
		return nil, err
	}
	var source func(context.Context) iter.Seq2[K, error]
	if c.keySource != nil {
		f, ok := c.keySource.(func(context.Context) iter.Seq2[K, error])
		if !ok {
			return nil, fmt.Errorf("guard: WithKeySource is %T, not a source of keys of type %T", c.keySource, *new(K))
		}
		source = f
	}
	var batch func(context.Context, []K) (map[K]V, error)
	if c.batch != nil {
		f, ok := c.batch.(func(context.Context, []K) (map[K]V, error))
		if !ok {
			return nil, fmt.Errorf("guard: WithBatchLookup is %T, not a batch lookup of keys of type %T and values of type %T", c.batch, *new(K), *new(V))
		}
		batch = f
	}
	if !g.owned.CompareAndSwap(false, true) {
		return nil, errors.New("guard: NewLoader: the guard already has a Loader, which closes it; give each Loader a guard of its own")
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loader[K, V]{
		lookup: lookup, batch: batch, codec: codec, source: source, cfg: c,
		ctx: ctx, cancel: cancel,
		storeCalls: xsync.NewCounter(), avoided: xsync.NewCounter(), falsePos: xsync.NewCounter(),
		negHits: xsync.NewCounter(), passed: xsync.NewCounter(), letThrough: xsync.NewCounter(),
		rebuilds: xsync.NewCounter(), rebuildErrs: xsync.NewCounter(), batchCalls: xsync.NewCounter(),
	}
	if c.negSize > 0 {
		l.neg = newNegCache[K](c.negSize, c.negTTL, c.now)
	}
	l.cur.Store(newView(g))
	return l, nil
}

// Hash returns the hash under which key is stored in the guard, for
// callers that consult the guard directly (such as HTTP middleware).
func (l *Loader[K, V]) Hash(key K) uint64 {
	return l.codec.hash(l.cur.Load().g, key)
}

// Guard returns the guard the Loader consults now; a rebuild replaces it.
func (l *Loader[K, V]) Guard() *Guard {
	return l.cur.Load().g
}

// Ready reports whether the guard holds every key of the store, so that
// the Loader answers ErrNotFound without asking the store.
func (l *Loader[K, V]) Ready() bool {
	return l.ready.Load()
}

// MayContain reports whether Get might find key in the store: false only
// when the Loader is ready and the guard knows the key is absent. It does
// not call the store and does not allocate for string and integer keys.
// Like Get, it counts a false answer as a lookup avoided and a true answer
// while not ready (or for a shard that refused a key) as one passed through, so
// that HTTP middleware built on it shows up in [Loader.Stats].
func (l *Loader[K, V]) MayContain(key K) bool {
	// ready before cur: a resync swaps in its guard and then sets ready,
	// so a true ready guarantees the guard loaded next is that one.
	ready := l.ready.Load()
	v := l.cur.Load()
	h := l.codec.hash(v.g, key)
	if !ready || v.passes(h) {
		l.passed.Inc()
		return true
	}
	if !v.g.ContainsHash(h) {
		l.avoided.Inc()
		return false
	}
	l.letThrough.Inc()
	return true
}

// Get returns the value of key. If the Loader is ready and the guard knows
// the key is absent, Get returns [ErrNotFound] without calling the store.
// Otherwise it calls the store, sharing one call among concurrent Gets of
// the same key.
//
// A store "not found" (see [WithNotFound]) is returned as ErrNotFound
// itself, not as the store's error, so that a missing key reads the same
// whether the guard or the store answered, before and after warm-up; if
// the guard had let the key through, it counts as an observed false
// positive.
//
// The shared call runs under the context of the Get that started it
// (bounded by [WithLoadTimeout] if set). A Get whose ctx ends stops
// waiting and returns ctx.Err(); if it was the one whose call was running,
// that call ends too (the store stops working for nobody) and the Gets
// still waiting start a new one. One caller leaving never fails the others.
func (l *Loader[K, V]) Get(ctx context.Context, key K) (V, error) {
	var zero V
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	ready := l.ready.Load() // before cur: see MayContain
	v := l.cur.Load()
	h := l.codec.hash(v.g, key)
	guarded := ready && !v.passes(h)
	// Read the epoch and the generation before the store: an insert of key,
	// or a resync, that happens after this point voids what we may cache
	// below.
	epoch, gen := l.epoch(h).Load(), l.negGen.Load()
	if guarded {
		if !v.g.ContainsHash(h) {
			l.avoided.Inc()
			return zero, ErrNotFound
		}
		if l.neg != nil && l.neg.has(key, epoch, gen) {
			l.negHits.Inc()
			return zero, ErrNotFound
		}
		l.letThrough.Inc()
	} else {
		l.passed.Inc()
	}
	val, err := l.flight.do(ctx, h, key, l.load)
	if err != nil && l.notFound(err) {
		if guarded {
			l.falsePos.Inc()
			if l.neg != nil {
				l.neg.add(key, epoch, gen)
			}
		}
		return zero, ErrNotFound
	}
	return val, err
}

// load is one call of the store's lookup, bounded by WithLoadTimeout.
func (l *Loader[K, V]) load(ctx context.Context, key K) (V, error) {
	if l.cfg.loadTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.cfg.loadTimeout)
		defer cancel()
	}
	l.storeCalls.Inc()
	return l.lookup(ctx, key)
}

func (l *Loader[K, V]) epoch(h uint64) *atomic.Uint64 {
	return &l.epochs[h%uint64(len(l.epochs))]
}

// Close stops a rebuild in progress, waits for it, and closes the guards.
// Lookups keep working afterwards (see [Guard.Close]); inserts return an
// error. Close is idempotent and returns nil.
func (l *Loader[K, V]) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		l.cancel()
		l.wg.Wait()
		l.cur.Load().g.Close()
	})
	return nil
}

// LoaderStats describes a Loader. Its counters are read one by one and do
// not necessarily form a consistent snapshot. Every lookup (Get, a key of
// GetMany, MayContain) counts once in exactly one of Avoided,
// NegativeCacheHits, LetThrough and PassedThrough.
type LoaderStats struct {
	Ready             bool    // the guard answers ErrNotFound on its own
	StoreCalls        uint64  // calls of the lookup function and of the batch lookup
	BatchCalls        uint64  // calls of the batch lookup (WithBatchLookup)
	Avoided           uint64  // lookups answered ErrNotFound without the store
	LetThrough        uint64  // lookups the guard let through to the store: the key may exist
	FalsePositives    uint64  // store "not found" for keys the guard let through
	ObservedFPR       float64 // FalsePositives / (FalsePositives + Avoided)
	NegativeCacheHits uint64  // ErrNotFound from the negative cache
	PassedThrough     uint64  // lookups sent to the store unguarded (not ready, or a shard that refused a key)
	PassThroughShards int     // shards that pass lookups through until the next rebuild
	Rebuilding        bool    // a rebuild is running
	Rebuilds          uint64  // rebuilds swapped in
	RebuildErrors     uint64  // rebuilds that failed
	Guard             Stats   // the current guard
}

// Stats returns the Loader's statistics.
func (l *Loader[K, V]) Stats() LoaderStats {
	v := l.cur.Load()
	st := LoaderStats{
		Ready:             l.ready.Load(),
		StoreCalls:        uint64(l.storeCalls.Value()),
		BatchCalls:        uint64(l.batchCalls.Value()),
		Avoided:           uint64(l.avoided.Value()),
		LetThrough:        uint64(l.letThrough.Value()),
		FalsePositives:    uint64(l.falsePos.Value()),
		NegativeCacheHits: uint64(l.negHits.Value()),
		PassedThrough:     uint64(l.passed.Value()),
		Rebuilding:        l.rebuilding.Load(),
		Rebuilds:          uint64(l.rebuilds.Value()),
		RebuildErrors:     uint64(l.rebuildErrs.Value()),
		Guard:             v.g.Stats(),
	}
	for i := range v.pass {
		if v.pass[i].Load() {
			st.PassThroughShards++
		}
	}
	if n := st.FalsePositives + st.Avoided; n > 0 {
		st.ObservedFPR = float64(st.FalsePositives) / float64(n)
	}
	return st
}
