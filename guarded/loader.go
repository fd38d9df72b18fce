package guarded

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/options"
	"github.com/cuckooguard/cuckooguard/internal/owner"
)

// Loader wraps a store lookup with a guard: [Loader.Get] answers
// [ErrNotFound] for keys the guard knows are absent without calling the
// store, and coalesces concurrent lookups of the same key. [Loader.Insert]
// and [Loader.Delete] keep the guard in step with the store's writes.
//
// Until the guard holds every key of the store the Loader passes every
// lookup through: after [Loader.Fill] (a fresh guard), [Loader.CatchUp] (a
// guard restored from a snapshot), [Loader.MarkReady] (a guard the caller
// filled) or a change feed's [Feed.MarkReady] ([Loader.AttachFeed]). Insert
// adds a key before its write and keeps it if the write's outcome is
// unknown, through rebuilds too, until the store settles it
// ([WithUnsettled]); Delete removes a key only after the store confirmed the delete,
// and only where that cannot take another key's copy (the package
// documentation, "Copies and removals", gives every case). A shard that
// cannot take a key passes its lookups through until a rebuild swaps in a
// fresh guard, from the store's keys ([KeyLister]) or through the feed; a
// rebuild also runs when the estimated false-positive rate passes
// [WithMaxFPR].
//
// A Loader is safe for concurrent use by multiple goroutines. It owns the
// guard it was given and closes it in [Loader.Close]; a guard can have at
// most one Loader.
type Loader[K comparable, V any] struct {
	// What New was given.
	src   source[K, V]
	codec keyCodec[K]
	cfg   config

	// Read path (get.go, getmany.go): the guard lookups use, the store
	// calls in flight, the negative cache and its invalidation, and the
	// counters of Stats.
	cur    atomic.Pointer[view]
	flight flight[K, V]       // coalesces store lookups
	neg    *negCache[K]       // nil without WithNegativeCache
	epochs [256]atomic.Uint64 // bumped by inserts, by key hash: invalidate negative entries
	negGen atomic.Uint64      // bumped by Invalidate and guard swaps: invalidates them all

	storeCalls, avoided, falsePos, negHits, passed, letThrough, batchCalls *xsync.Counter

	// Consistency tokens (token.go): how far the feed has applied the
	// store's changes, and the counters of lookups that carried a token.
	reach                                               reach
	tokenLookups, tokenWaits, tokenPassed, tokenForeign *xsync.Counter

	// Writes (write.go). writeMu orders writes against the start and the
	// end of a rebuild: an insert holds it shared from its guard add to
	// the end of its write, so that the rebuild, which takes it
	// exclusively, sees every insert either finished (in the store, for
	// the key source to read) or not begun (and so reaching the new guard
	// too). A delete holds it so that the guard it removes from is the one
	// it found ready.
	writeMu   sync.RWMutex
	inserts   keyLocks[K]   // one Insert per key at a time
	insertN   atomic.Uint64 // inserts, to check the FPR every 4096
	unsettled *unsettled    // keys of inserts whose outcome is unknown, for rebuilds (unsettled.go)

	// Readiness and the change feed (readiness.go, feed.go).
	ready  readiness                  // lease.go
	rule   atomic.Pointer[keyRule[K]] // the store's key rule, or nil (keyrule.go)
	filled atomic.Bool                // a Fill is running or has succeeded: no other may run
	feed   atomic.Pointer[Feed[K]]    // the attached change feed, or nil

	// Rebuilds (rebuild.go): a fresh guard filled in the background and
	// swapped in for cur.
	shadow       atomic.Pointer[view] // the guard a rebuild fills, or nil
	rebuildMu    sync.Mutex           // held while a rebuild or resync builds a guard
	rebuilding   atomic.Bool
	rebuildDelay time.Duration // backoff after failed rebuilds; under mu
	rebuildAfter atomic.Int64  // unix nanoseconds before which no rebuild starts

	rebuilds, rebuildErrs *xsync.Counter

	// Life cycle: Close cancels ctx and waits for wg.
	mu        sync.Mutex // protects closed, wg.Add and rebuildDelay
	closed    bool
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup // rebuild goroutines
	closeOnce sync.Once
}

// view is one guard with the shards whose lookups must pass through.
type view struct {
	g       *guard.Guard
	pass    []atomic.Bool // per shard: it refused a key (guard.ErrFull), which may be missing
	passAny atomic.Bool
	// recheckAt is set for a view that a rebuild made to pass every
	// lookup through because it may lack keys of writes with an unknown
	// outcome that the Loader could not remember (see unsettled): the
	// unix nanoseconds after which a rebuild would not, and should run.
	// Set before the view is published.
	recheckAt int64
	// settleSeq is the number of the last unknown outcome recorded
	// before a rebuild began to fill the view (see unsettled.readSettles).
	settleSeq uint64
	// over counts, per key hash, the copies the guard refused because it
	// held guard.MaxCopies of the key already (Loader.add): copies owed,
	// which a removal takes before a copy the guard holds (Loader.remove),
	// and which answer "present" for their key (overCopies.owes).
	over overCopies
}

// overCopies are the copies of keys that a guard refused at
// guard.MaxCopies (see view.over). A unique key needs more than
// MaxCopies copies only while a change feed runs behind this process's
// own writes: a key deleted and inserted again through the Loader five
// times before the stream brings the first deletion. Each Insert adds a
// copy; the feed then applies every deletion. Without this count the
// refused copies were never owed, and the deletions took the last copy
// of a live key (postgres' TestOwnInsertsAheadOfTheStream).
type overCopies struct {
	any atomic.Bool // some count is above zero: removals need not lock otherwise
	mu  sync.Mutex
	n   map[uint64]uint32
}

// add counts one refused copy of h.
func (o *overCopies) add(h uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[uint64]uint32{}
	}
	if o.n[h] < math.MaxUint32 {
		o.n[h]++
	}
	o.any.Store(true)
}

// owes reports whether a refused copy of h is counted: the key is present
// even if the guard holds no copy of it. The guard refuses a copy when it
// holds MaxCopies of the key or of keys it cannot tell from it (the same
// fingerprint, buckets and tail); the copies of those other keys leave
// with their removals, and the refused key would then read absent while
// its row exists. A lookup that the guard answered "absent" asks this
// too: one atomic load, inlined, while nothing is owed, as almost always.
func (o *overCopies) owes(h uint64) bool {
	return o.any.Load() && o.counted(h)
}

// counted is owes once some copy is owed.
func (o *overCopies) counted(h uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[h] != 0
}

// take takes one refused copy of h, if one is counted.
func (o *overCopies) take(h uint64) bool {
	if !o.any.Load() {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.n[h]
	if c == 0 {
		return false
	}
	if c == 1 {
		delete(o.n, h)
		o.any.Store(len(o.n) > 0)
	} else {
		o.n[h] = c - 1
	}
	return true
}

// newView returns the view of g, whose degraded shards (a guard restored
// from the snapshot of one whose shards refused keys, see
// guard.Guard.Degraded) pass their lookups through: the keys they refused
// exist only in the store.
func newView(g *guard.Guard) *view {
	v := &view{g: g, pass: make([]atomic.Bool, g.Shards())}
	for i := range v.pass {
		if g.Degraded(i) {
			v.markPass(i)
		}
	}
	return v
}

// markPass makes the lookups of shard i pass through, and marks it in the
// guard too, so that a snapshot of the guard keeps the mark.
func (v *view) markPass(i int) {
	v.g.MarkDegraded(i)
	v.pass[i].Store(true)
	v.passAny.Store(true)
}

// passes reports whether lookups of hash h must reach the store because
// h's shard could not take every key.
func (v *view) passes(h uint64) bool {
	return v.passAny.Load() && v.pass[v.g.ShardIndex(h)].Load()
}

// New returns a Loader that guards store with g and takes ownership of g:
// [Loader.Close] closes it. The Loader passes every lookup through until
// it is ready (see [Loader]). It returns an error for invalid options, a
// key type the Loader cannot hash (see [Key]), a store with a GetMany or
// Keys method of the wrong type, or a guard that is closed or that another
// Loader owns.
func New[K comparable, V any](g *guard.Guard, store Getter[K, V], opts ...Option) (*Loader[K, V], error) {
	c := config{
		isNotFound:   defaultIsNotFound,
		notWritten:   NotWritten,
		maxFPR:       DefaultMaxFPR,
		loadTimeout:  DefaultLoadTimeout,
		fillWorkers:  runtime.GOMAXPROCS(0),
		logger:       discardLogger,
		fresh:        freshGuard,
		now:          time.Now,
		maxUnsettled: DefaultMaxUnsettled,
		settleTime:   DefaultSettleTime,
		tokenWait:    DefaultTokenWait,
	}
	if err := options.Apply("guarded: New", &c, opts); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if g == nil {
		return nil, errors.New("guarded: New needs a guard")
	}
	if g.Closed() {
		return nil, errors.New("guarded: New: the guard is closed (guard.Guard.Close); give the Loader an open one")
	}
	src, err := sourceOf(store)
	if err != nil {
		return nil, err
	}
	codec, err := newKeyCodec[K]()
	if err != nil {
		return nil, err
	}
	if !own(g) {
		return nil, errOwned
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loader[K, V]{
		src: src, codec: codec, cfg: c,
		ctx: ctx, cancel: cancel,
		storeCalls: xsync.NewCounter(), avoided: xsync.NewCounter(), falsePos: xsync.NewCounter(),
		negHits: xsync.NewCounter(), passed: xsync.NewCounter(), letThrough: xsync.NewCounter(),
		rebuilds: xsync.NewCounter(), rebuildErrs: xsync.NewCounter(), batchCalls: xsync.NewCounter(),
		tokenLookups: xsync.NewCounter(), tokenWaits: xsync.NewCounter(), tokenPassed: xsync.NewCounter(), tokenForeign: xsync.NewCounter(),
	}
	if c.negSize > 0 {
		l.neg = newNegCache[K](c.negSize, c.negTTL, c.now)
	}
	l.unsettled = newUnsettled(c.maxUnsettled, c.settleTime)
	l.ready.born = time.Now()
	l.cur.Store(newView(g))
	return l, nil
}

// own records that a Loader owns g, and reports false if one did already:
// a guard has at most one Loader, which closes it. The mark is the
// guard's own (internal/owner), not a registry that would keep every
// guard ever owned reachable.
func own(g *guard.Guard) bool {
	return owner.Claim(g)
}

// Hash returns the hash under which key is stored in the guard, for
// callers that consult the guard directly with [guard.Guard.ContainsHash]
// (package middleware does not: it calls [Loader.MayContain], which also
// answers true while the Loader warms up or passes keys through).
func (l *Loader[K, V]) Hash(key K) uint64 {
	return l.codec.hash(l.cur.Load().g, key)
}

// Guard returns the guard the Loader consults now; a rebuild replaces it.
func (l *Loader[K, V]) Guard() *guard.Guard {
	return l.cur.Load().g
}

// Ready reports whether the guard holds every key of the store, so that
// the Loader answers ErrNotFound without asking the store. A Loader whose
// feed holds a lease ([Feed.ReadyUntil]) is ready until the lease runs
// out, on the clock at the moment Ready is called.
func (l *Loader[K, V]) Ready() bool {
	return l.ready.ready()
}

// isClosed reports whether Close has begun.
func (l *Loader[K, V]) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Close stops a rebuild in progress, waits for it, and closes the guards.
// Lookups keep working afterwards (see [guard.Guard.Close]); inserts return an
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
