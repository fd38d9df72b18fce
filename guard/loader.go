package guard

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"
)

// ErrNotFound is returned by [Loader.Get] for a key that is not in the
// store: either the guard knows it is absent (the store was not asked) or
// the store said so (the error then also wraps the store's error).
var ErrNotFound = errors.New("guard: not found")

// ErrMaybeWritten tells [Loader.Insert] that a write failed in a way that
// leaves its outcome unknown (say, a commit whose acknowledgement was
// lost). Wrap such errors with it: Insert then keeps the key in the guard,
// a possible false positive, instead of rolling it back, a possible false
// negative.
var ErrMaybeWritten = errors.New("guard: write may have happened")

// Loader wraps a store lookup with a guard: [Loader.Get] answers
// [ErrNotFound] for keys the guard knows are absent without calling the
// store, and coalesces concurrent lookups of the same key. [Loader.Insert]
// and [Loader.Delete] keep the guard in step with the store's writes.
//
// # Keeping the promise of no false negatives
//
//   - Until the guard holds every key of the store, the Loader passes every
//     lookup through: after [Loader.Fill] (a fresh guard),
//     [Loader.CatchUp] (a guard restored from a snapshot) or
//     [Loader.MarkReady] (a guard the caller filled).
//   - Insert adds the key to the guard before the write, so no reader can
//     see the row before the guard has the key, and removes it again if the
//     write fails. Delete removes the key only after the store confirmed it
//     deleted an existing row. Never remove a key that was not added: two
//     keys can share a fingerprint.
//   - A shard that cannot take a key ([ErrFull]) passes its lookups through
//     from then on, and the Loader rebuilds a fresh guard from the key
//     source ([WithKeySource]) in the background and swaps it in. It does
//     the same when the guard's estimated false-positive rate passes
//     [WithMaxFPR]. Inserts during a rebuild reach both guards; deletes
//     reach only the current one, so the new guard may keep a few deleted
//     keys (false positives, never false negatives).
//
// A Loader is safe for concurrent use by multiple goroutines. It owns the
// guard it was given and closes it in [Loader.Close].
type Loader[K comparable, V any] struct {
	lookup func(ctx context.Context, key K) (V, error)
	codec  keyCodec[K]
	source func(ctx context.Context) iter.Seq2[K, error]
	cfg    loaderConfig

	cur    atomic.Pointer[view] // the guard lookups use
	shadow atomic.Pointer[view] // the guard a rebuild fills, or nil
	// writeMu orders inserts against the start and the end of a rebuild:
	// an insert holds it shared from its guard add to the end of its
	// write, so that the rebuild, which takes it exclusively, sees every
	// insert either finished (in the store, for the key source to read) or
	// not begun (and so reaching the new guard too).
	writeMu sync.RWMutex
	ready   atomic.Bool

	// sf coalesces store lookups. One Group has one mutex; spread over
	// several by key hash, lookups of different keys rarely contend.
	sf     [sfGroups]singleflight.Group
	neg    *negCache[K]
	epochs [256]atomic.Uint64 // bumped by inserts, by key hash: invalidate negative entries
	negGen atomic.Uint64      // bumped by Invalidate and guard swaps: invalidates them all

	mu         sync.Mutex // protects closed and wg.Add
	closed     bool
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup // rebuild goroutines
	rebuilding atomic.Bool
	rebuildMu  sync.Mutex // held while a rebuild or resync builds a guard
	closeOnce  sync.Once

	insertN atomic.Uint64 // inserts, to check the FPR every 4096

	storeCalls, avoided, falsePos, negHits, passed *xsync.Counter
	rebuilds, rebuildErrs                          *xsync.Counter
}

const sfGroups = 64

// group returns the singleflight group for hash h.
func (l *Loader[K, V]) group(h uint64) *singleflight.Group {
	return &l.sf[h%sfGroups]
}

// view is one guard with the shards whose lookups must pass through.
type view struct {
	g       *Guard
	pass    []atomic.Bool // per shard: saturated, a key may be missing
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

// NewLoader returns a Loader that guards lookup with g. The Loader passes
// every lookup through until it is ready (see [Loader]). It returns an
// error for invalid options or a key type that needs [WithKeyBytes].
func NewLoader[K comparable, V any](g *Guard, lookup func(ctx context.Context, key K) (V, error), opts ...LoaderOption) (*Loader[K, V], error) {
	c := loaderConfig{
		isNotFound:  defaultIsNotFound,
		maxFPR:      DefaultMaxFPR,
		loadTimeout: DefaultLoadTimeout,
		fillWorkers: runtime.GOMAXPROCS(0),
		logger:      slog.Default(),
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
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loader[K, V]{
		lookup: lookup, codec: codec, source: source, cfg: c,
		ctx: ctx, cancel: cancel,
		storeCalls: xsync.NewCounter(), avoided: xsync.NewCounter(), falsePos: xsync.NewCounter(),
		negHits: xsync.NewCounter(), passed: xsync.NewCounter(),
		rebuilds: xsync.NewCounter(), rebuildErrs: xsync.NewCounter(),
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
// while not ready (or for a saturated shard) as one passed through, so
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
	return true
}

// Get returns the value of key. If the Loader is ready and the guard knows
// the key is absent, Get returns [ErrNotFound] without calling the store.
// Otherwise it calls the store, sharing one call among concurrent Gets of
// the same key: a caller whose ctx ends stops waiting and gets ctx.Err(),
// while the shared call goes on for the others (bounded by
// [WithLoadTimeout] if set) and its result or error reaches every waiter. A store
// "not found" (see [WithNotFound]) returns an error matching both
// ErrNotFound and the store's error; if the guard had let the key through,
// it counts as an observed false positive.
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
	} else {
		l.passed.Inc()
	}
	val, err := l.load(ctx, l.group(h), key)
	if err != nil && l.cfg.isNotFound(err) {
		if guarded {
			l.falsePos.Inc()
			if l.neg != nil {
				l.neg.add(key, epoch, gen)
			}
		}
		if errors.Is(err, ErrNotFound) {
			return zero, err
		}
		return zero, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return val, err
}

// load calls the store through singleflight and waits for the result or
// ctx, whichever comes first.
func (l *Loader[K, V]) load(ctx context.Context, sf *singleflight.Group, key K) (V, error) {
	call := func() (any, error) {
		// The shared call must not die with the first caller's ctx: run it
		// under the ctx's values only (and WithLoadTimeout's deadline).
		lctx := context.WithoutCancel(ctx)
		if l.cfg.loadTimeout > 0 {
			var cancel context.CancelFunc
			lctx, cancel = context.WithTimeout(lctx, l.cfg.loadTimeout)
			defer cancel()
		}
		l.storeCalls.Inc()
		return l.lookup(lctx, key)
	}
	if ctx.Done() == nil {
		// A ctx that is never done needs no select: wait in this goroutine
		// and save DoChan's goroutine and channel.
		r, err, _ := sf.Do(l.codec.str(key), call)
		val, _ := r.(V)
		return val, err
	}
	ch := sf.DoChan(l.codec.str(key), call)
	select {
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	case r := <-ch:
		val, _ := r.Val.(V) // nil for an error or a nil interface value
		return val, r.Err
	}
}

func (l *Loader[K, V]) epoch(h uint64) *atomic.Uint64 {
	return &l.epochs[h%uint64(len(l.epochs))]
}

// add adds hash h to the guard of v and reports whether it did. A full
// shard is marked to pass its lookups through, and a rebuild is started.
func (l *Loader[K, V]) add(v *view, h uint64) (bool, error) {
	err := v.g.AddHash(h)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, ErrClosed) && v != l.cur.Load() && v != l.shadow.Load() {
		// A rebuild replaced v while a Fill or CatchUp was adding to it.
		// The new guard was filled from the key source after every write
		// in flight had finished, so it covers this key already.
		return false, nil
	}
	if !errors.Is(err, ErrFull) {
		return false, err
	}
	v.pass[v.g.ShardIndex(h)].Store(true)
	v.passAny.Store(true)
	l.rebuild()
	return false, nil
}

// Insert writes key to the store through write, keeping the guard in step:
// it adds key to the guard before write runs, so that no lookup can see the
// new row before the guard has its key, and removes it again if write
// returns an error (unless the error wraps [ErrMaybeWritten]). Insert adds
// one copy per call: call it once per row created. It returns write's
// error, ctx.Err() if ctx ended before anything happened, or an error if
// the guard is closed (write is then not called).
func (l *Loader[K, V]) Insert(ctx context.Context, key K, write func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	cur, sh := l.cur.Load(), l.shadow.Load()
	h := l.codec.hash(cur.g, key)
	e := l.epoch(h)
	e.Add(1)
	inCur, err := l.add(cur, h)
	if err != nil {
		return fmt.Errorf("guard: insert: %w", err)
	}
	inShadow := false
	if sh != nil {
		inShadow, _ = l.add(sh, h) // a failed rebuild closes sh: nothing to keep
	}
	werr := write(ctx)
	if werr != nil && !errors.Is(werr, ErrMaybeWritten) {
		if inCur {
			cur.g.RemoveHash(h)
		}
		if inShadow {
			sh.g.RemoveHash(h)
		}
		return werr
	}
	// Lookups that began before the write may have joined a store call
	// that missed the row: later ones must not join it, nor trust a
	// negative entry cached by it.
	l.group(h).Forget(l.codec.str(key))
	e.Add(1)
	if l.insertN.Add(1)%4096 == 0 {
		l.checkFPR()
	}
	return werr
}

// Delete deletes key from the store through write, which reports whether a
// row existed. Only then, and only after write returned, does Delete remove
// key from the guard. It returns write's error or ctx.Err().
func (l *Loader[K, V]) Delete(ctx context.Context, key K, write func(ctx context.Context) (existed bool, err error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// The guard that had the key when the write began is the one to
	// remove it from: a rebuild swapped in meanwhile may never have had it
	// (its read ran after the delete), and removing a key a guard does not
	// hold can remove another key. writeMu keeps swaps out until we are done.
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	cur := l.cur.Load()
	existed, err := write(ctx)
	if err != nil || !existed {
		return err
	}
	h := l.codec.hash(cur.g, key)
	l.group(h).Forget(l.codec.str(key))
	cur.g.RemoveHash(h)
	return nil
}

// Fill adds every key of keys to the guard, in parallel ([WithFillWorkers]),
// reporting progress ([WithFillProgress]), and marks the Loader ready when
// it has added them all. Give it every key of the store, read after the
// Loader was made, with writes going through [Loader.Insert] meanwhile (a
// key both written and read is added twice, which is harmless). It returns
// the key source's error or ctx.Err() and then leaves the Loader as ready
// as it was.
func (l *Loader[K, V]) Fill(ctx context.Context, keys iter.Seq2[K, error]) error {
	start := time.Now()
	n, err := l.fill(ctx, l.cur.Load(), keys)
	if err != nil {
		return fmt.Errorf("guard: fill: %w", err)
	}
	l.ready.Store(true)
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: guard filled",
		slog.Int64("keys", n), slog.Duration("took", time.Since(start)))
	l.checkFPR()
	return nil
}

// fill adds keys to v's guard and returns how many it added.
func (l *Loader[K, V]) fill(ctx context.Context, v *view, keys iter.Seq2[K, error]) (int64, error) {
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(l.cfg.fillWorkers)
	var added atomic.Int64
	var progressMu sync.Mutex
	batch := make([]uint64, 0, DefaultFillBatch)
	flush := func() {
		b := batch
		batch = make([]uint64, 0, DefaultFillBatch)
		eg.Go(func() error {
			for _, h := range b {
				if _, err := l.add(v, h); err != nil {
					return err
				}
			}
			n := added.Add(int64(len(b)))
			if l.cfg.progress != nil {
				progressMu.Lock()
				l.cfg.progress(n)
				progressMu.Unlock()
			}
			return nil
		})
	}
	var srcErr error
	for k, err := range keys {
		if err != nil {
			srcErr = err
			break
		}
		if ectx.Err() != nil {
			break
		}
		batch = append(batch, l.codec.hash(v.g, k))
		if len(batch) == cap(batch) {
			flush()
		}
	}
	if srcErr == nil && len(batch) > 0 {
		flush()
	}
	if err := eg.Wait(); err != nil {
		return added.Load(), err
	}
	if srcErr != nil {
		return added.Load(), srcErr
	}
	return added.Load(), ctx.Err()
}

// Change is one write to the store, for [Loader.CatchUp].
type Change[K comparable] struct {
	Key     K
	Deleted bool // the row was deleted; else it was created
}

// CatchUp applies, in order, the store's writes since the guard's snapshot
// was written (see [Restore]) and marks the Loader ready. Until then a
// Loader over a restored guard passes every lookup through, because the
// snapshot is older than the store. Report a deletion only for a row that
// existed when the snapshot was written or was created by an earlier
// change: removing a key the guard never had could remove another key's
// fingerprint. If the store cannot list its changes, start from an empty
// guard and call [Loader.Fill] instead.
func (l *Loader[K, V]) CatchUp(ctx context.Context, changes iter.Seq2[Change[K], error]) error {
	v := l.cur.Load()
	n := 0
	for c, err := range changes {
		if err != nil {
			return fmt.Errorf("guard: catch up: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		h := l.codec.hash(v.g, c.Key)
		if c.Deleted {
			v.g.RemoveHash(h)
		} else if _, err := l.add(v, h); err != nil {
			return fmt.Errorf("guard: catch up: %w", err)
		}
		n++
	}
	l.ready.Store(true)
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: guard caught up", slog.Int("changes", n))
	return nil
}

// MarkReady declares that the guard holds every key of the store, for a
// caller that filled it directly.
func (l *Loader[K, V]) MarkReady() {
	l.ready.Store(true)
}

// Invalidate declares that the guard may lack keys of the store (for
// example, a change feed was interrupted): every lookup passes through
// until the Loader is ready again ([Loader.Resync], [Loader.Fill],
// [Loader.CatchUp] or [Loader.MarkReady]).
func (l *Loader[K, V]) Invalidate() {
	l.ready.Store(false)
	l.negGen.Add(1) // rows may have appeared that no insert told us of
}

// Apply applies a write that another process made to the store and that
// this process learned of from a change feed: a created key is added to
// the guard (and to a guard being rebuilt), a deleted one removed. Report
// only committed writes, each once, in commit order, and never this
// process's own writes, which [Loader.Insert] and [Loader.Delete] applied
// already: a deletion applied twice could remove another key.
func (l *Loader[K, V]) Apply(c Change[K]) error {
	if c.Deleted {
		cur := l.cur.Load()
		cur.g.RemoveHash(l.codec.hash(cur.g, c.Key))
		return nil
	}
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	cur, sh := l.cur.Load(), l.shadow.Load()
	h := l.codec.hash(cur.g, c.Key)
	l.epoch(h).Add(1) // voids negative-cache entries of the key
	if _, err := l.add(cur, h); err != nil {
		return fmt.Errorf("guard: apply: %w", err)
	}
	if sh != nil {
		l.add(sh, h) // a failed rebuild closes sh: nothing to keep
	}
	// As in Insert: later lookups must not join a store call that began
	// before the row existed, nor trust what such a call cached.
	l.group(h).Forget(l.codec.str(c.Key))
	l.epoch(h).Add(1)
	return nil
}

// Resync builds a fresh guard while the Loader passes every lookup
// through and swaps it in; the Loader stays invalid until the caller has
// applied the changes the fill did not see and calls [Loader.MarkReady].
// fill gets functions
// that add keys to and remove keys from the fresh guard; inserts made
// through this Loader meanwhile reach it too. A change feed uses it to
// start over after an interruption: read every key, then the changes the
// read did not see.
func (l *Loader[K, V]) Resync(ctx context.Context, fill func(ctx context.Context, add func(K) error, remove func(K)) error) error {
	l.Invalidate()
	err := l.replace(ctx, func(ctx context.Context, nv *view) (int64, error) {
		var n int64
		add := func(k K) error {
			n++
			_, err := l.add(nv, l.codec.hash(nv.g, k))
			return err
		}
		remove := func(k K) { nv.g.RemoveHash(l.codec.hash(nv.g, k)) }
		err := fill(ctx, add, remove)
		return n, err
	})
	if err != nil {
		return fmt.Errorf("guard: resync: %w", err)
	}
	return nil
}

// checkFPR starts a rebuild if the guard's estimated false-positive rate
// passed the limit.
func (l *Loader[K, V]) checkFPR() {
	if l.source != nil && !l.rebuilding.Load() && l.cur.Load().g.Stats().EstimatedFPR > l.cfg.maxFPR {
		l.rebuild()
	}
}

// rebuild starts a background rebuild unless one is running, the Loader
// has no key source, or it is closed.
func (l *Loader[K, V]) rebuild() {
	if l.source == nil || !l.rebuilding.CompareAndSwap(false, true) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		l.rebuilding.Store(false)
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer l.rebuilding.Store(false)
		if err := l.rebuildNow(l.ctx); err != nil {
			l.rebuildErrs.Inc()
			l.cfg.logger.LogAttrs(l.ctx, slog.LevelError, "cuckooguard: rebuild failed", slog.Any("error", err))
		}
	}()
}

// rebuildNow builds a fresh guard from the key source while inserts reach
// both guards, then swaps it in.
func (l *Loader[K, V]) rebuildNow(ctx context.Context) error {
	return l.replace(ctx, func(ctx context.Context, nv *view) (int64, error) {
		return l.fill(ctx, nv, l.source(ctx))
	})
}

// replace builds a fresh guard with fill while inserts reach both guards,
// then swaps it in. Rebuilds and resyncs take turns.
func (l *Loader[K, V]) replace(ctx context.Context, fill func(context.Context, *view) (int64, error)) error {
	l.rebuildMu.Lock()
	defer l.rebuildMu.Unlock()
	start := time.Now()
	old := l.cur.Load()
	opts := append(append([]Option(nil), l.cfg.guardOpts...),
		WithCapacity(rebuildCapacity(old.g)), WithSeed(old.g.Seed()))
	ng, err := New(opts...)
	if err != nil {
		return fmt.Errorf("guard: rebuild: %w", err)
	}
	nv := newView(ng)
	l.writeMu.Lock() // waits for inserts in flight: their rows are in the store now
	l.shadow.Store(nv)
	l.writeMu.Unlock()
	n, err := fill(ctx, nv)
	if err != nil {
		l.writeMu.Lock()
		l.shadow.Store(nil)
		l.writeMu.Unlock()
		ng.Close()
		return fmt.Errorf("guard: rebuild: %w", err)
	}
	// l.mu orders the swap against Close: once Close has marked the
	// Loader closed no guard is swapped in, so none outlives Close. Lock
	// order: writeMu, then l.mu, as in an insert that triggers a rebuild.
	l.writeMu.Lock()
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.cur.Store(nv)
		l.negGen.Add(1)
	}
	l.shadow.Store(nil)
	l.mu.Unlock()
	l.writeMu.Unlock()
	if closed {
		ng.Close()
		return errors.New("guard: loader closed")
	}
	old.g.Close()
	l.rebuilds.Inc()
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: guard rebuilt",
		slog.Int64("keys", n), slog.Duration("took", time.Since(start)))
	return nil
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
// not necessarily form a consistent snapshot.
type LoaderStats struct {
	Ready             bool    // the guard answers ErrNotFound on its own
	StoreCalls        uint64  // calls of the lookup function
	Avoided           uint64  // lookups answered ErrNotFound without the store
	FalsePositives    uint64  // store "not found" for keys the guard let through
	ObservedFPR       float64 // FalsePositives / (FalsePositives + Avoided)
	NegativeCacheHits uint64  // ErrNotFound from the negative cache
	PassedThrough     uint64  // lookups sent to the store unguarded (not ready, or a saturated shard)
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
		Avoided:           uint64(l.avoided.Value()),
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

// rebuildCapacity sizes a replacement for g: room for its keys and a
// quarter more, and no smaller than about what g was sized for, so that a
// resync of a new Loader does not start from nothing.
func rebuildCapacity(g *Guard) int {
	st := g.Stats()
	return max(st.Items*5/4, st.Slots*8/10, 1024)
}
