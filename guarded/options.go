package guarded

import (
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
)

// Defaults of the Loader options.
const (
	// DefaultMaxFPR is the estimated false-positive rate above which a
	// Loader rebuilds its guard (from its store's keys, see [KeyLister],
	// or through its change feed).
	DefaultMaxFPR = 0.01
	// DefaultLoadTimeout is 0: a shared store lookup gets no deadline of its
	// own (see WithLoadTimeout for why).
	DefaultLoadTimeout = 0
	// DefaultFillBatch is the number of keys Fill hands a worker at once.
	DefaultFillBatch = 4096
	// DefaultMaxUnsettled is the number of keys of writes with an unknown
	// outcome that a Loader keeps through rebuilds (see WithUnsettled):
	// about 500 KB.
	DefaultMaxUnsettled = 10_000
	// DefaultSettleTime is how long after an insert with an unknown
	// outcome returned a Loader assumes its row, if it was written, is
	// visible (see WithUnsettled).
	DefaultSettleTime = 5 * time.Minute
)

// Option configures a [Loader] made by [New].
type Option func(*config)

type config struct {
	isNotFound   func(error) bool
	notWritten   func(error) bool
	negSize      int
	negTTL       time.Duration
	maxFPR       float64
	loadTimeout  time.Duration
	progress     func(added int64)
	logger       *slog.Logger
	fillWorkers  int
	fresh        func(old *guard.Guard, capacity int) (*guard.Guard, error)
	now          func() time.Time
	maxUnsettled int
	settleTime   time.Duration
	tokenWait    time.Duration
	// forgetUnknown drops every unknown outcome: a mutation for tests
	// (withoutUnsettled), never set otherwise.
	forgetUnknown bool
}

// WithNotFound sets how a Loader recognizes the store's "not found" error,
// besides [ErrNotFound], which it always recognizes. The default
// recognizes [sql.ErrNoRows] with [errors.Is].
func WithNotFound(isNotFound func(error) bool) Option {
	return func(c *config) { c.isNotFound = isNotFound }
}

// WithRollback sets how [Loader.Insert] decides, from its write's error,
// that the write certainly changed nothing, so that the key may leave the
// guard again: notWritten reports true only for such errors. An error for
// which it reports false keeps the key in the guard, a possible false
// positive; reporting true for a write that did commit would make its row
// read absent, a false negative, so when in doubt report false. The
// default is [NotWritten].
func WithRollback(notWritten func(err error) bool) Option {
	return func(c *config) { c.notWritten = notWritten }
}

// WithNegativeCache remembers, for ttl, up to size keys that the guard let
// through but the store did not have (false positives), so that repeated
// lookups of the same absent key do not reach the store every time. A key
// inserted through [Loader.Insert] leaves the cache at once; one whose
// insert's outcome is unknown is not cached until the store settles it
// (see [WithUnsettled]), since its row may show up later. Off by default.
// Each entry costs about 64 bytes plus the key.
func WithNegativeCache(size int, ttl time.Duration) Option {
	return func(c *config) { c.negSize, c.negTTL = size, ttl }
}

// WithUnsettled sets how a Loader keeps, through rebuilds, the keys of
// inserts whose outcome is unknown: a write that returned an error which
// [WithRollback] cannot prove harmless ([ErrMaybeWritten], a deadline, a
// lost reply) or panicked. Such a write may commit after it returned, and
// after a rebuild read the store's keys without it; the rebuilt guard
// would then miss a committed row. So every rebuild (and a feed's
// [Feed.Resync] and [Feed.Replace]) adds each such key to its guard, until
// the store settles it: the read of a later rebuild from the key source
// ([KeyLister]) contains it, or, for a unique key, a [Loader.Insert] of it
// that began later succeeds or a [Loader.Delete] that began later finds the
// row (a Delete settles nothing recorded while it ran: an insert of the key
// may have begun after the row it found was gone). A key whose row
// never shows is forgotten settle after its write returned: set settle
// longer than the store may take to make a write visible that its client
// gave up on (a commit waiting for a synchronous standby takes as long
// as the standby does).
//
// The Loader remembers at most max such keys, each about 50 bytes. An
// unknown outcome beyond them is not lost: a rebuild whose read begins
// less than settle after it swaps in a guard that passes every lookup
// through to the store, and the first lookup or insert after that time
// starts a rebuild that filters again ([Stats].UnsettledOverflows counts
// them). The defaults are [DefaultMaxUnsettled] and [DefaultSettleTime];
// max must be at least 0 and settle positive.
func WithUnsettled(max int, settle time.Duration) Option {
	return func(c *config) { c.maxUnsettled, c.settleTime = max, settle }
}

// WithMaxFPR sets the estimated false-positive rate, in (0, 1], above which
// the Loader rebuilds its guard (growth shortens the older keys'
// fingerprint tails and raises the rate). The default is [DefaultMaxFPR].
func WithMaxFPR(rate float64) Option {
	return func(c *config) { c.maxFPR = rate }
}

// WithLoadTimeout bounds one store lookup shared by coalesced callers
// with a deadline of d. The shared lookup runs under the context of the
// caller that started it (the leader), so that a store that honours
// cancellation stops working for a caller that left; if the leader's
// context ends first, the waiters do not get its error: one of them starts
// the lookup again under its own context (TestLoaderCoalescesAndHonoursContext).
// Callers never wait longer than their own ctx allows either way. The default, 0, adds no deadline and relies on the store's
// own timeouts: a cancellable context per lookup cost 40% of the
// throughput of in-process SQLite lookups in the bench load test (database/sql
// then starts and wakes a watcher goroutine per query).
func WithLoadTimeout(d time.Duration) Option {
	return func(c *config) { c.loadTimeout = d }
}

// WithFillProgress calls progress with the number of keys added so far,
// after every batch of a Fill or a rebuild. It is called from several
// goroutines, never concurrently.
func WithFillProgress(progress func(added int64)) Option {
	return func(c *config) { c.progress = progress }
}

// WithLogger sets where the Loader logs fills, rebuilds and failed
// rebuilds. By default it logs nothing: a library speaks only when asked.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithFillWorkers sets how many goroutines a Fill uses to add keys, at
// least 1. The default is GOMAXPROCS.
func WithFillWorkers(n int) Option {
	return func(c *config) { c.fillWorkers = n }
}

// WithRebuildGuard sets how a rebuild makes the guard that replaces old,
// sized for capacity keys (those old holds and a quarter more, at least
// old's own capacity). The default, old.Fresh(capacity), keeps old's
// configuration and seed; use this to change them, for example to lift a
// memory cap that a grown guard reached:
//
//	guarded.WithRebuildGuard(func(old *guard.Guard, n int) (*guard.Guard, error) {
//		return old.Fresh(n, guard.WithMaxBytes(64<<20))
//	})
//
// The new guard must have old's seed (every guard of a Loader hashes a key
// alike); a rebuild whose guard does not fails.
func WithRebuildGuard(fresh func(old *guard.Guard, capacity int) (*guard.Guard, error)) Option {
	return func(c *config) { c.fresh = fresh }
}

// freshGuard is the default of WithRebuildGuard.
func freshGuard(old *guard.Guard, capacity int) (*guard.Guard, error) {
	return old.Fresh(capacity)
}

func defaultIsNotFound(err error) bool {
	return errors.Is(err, sql.ErrNoRows) || errors.Is(err, ErrNotFound)
}

// discardLogger is the Loader's logger unless WithLogger sets one.
var discardLogger = slog.New(slog.DiscardHandler)

func (c *config) validate() error {
	if c.notWritten == nil || c.isNotFound == nil || c.logger == nil || c.fresh == nil {
		return errors.New("guarded: WithRollback, WithNotFound, WithLogger and WithRebuildGuard need a non-nil argument")
	}
	if c.negSize < 0 || c.negSize > 0 && c.negTTL <= 0 {
		return fmt.Errorf("guarded: negative cache of %d keys for %v is invalid", c.negSize, c.negTTL)
	}
	if !(c.maxFPR > 0 && c.maxFPR <= 1) {
		return fmt.Errorf("guarded: max FPR %v out of range (0, 1]", c.maxFPR)
	}
	if c.tokenWait < 0 {
		return fmt.Errorf("guarded: token wait %v must not be negative", c.tokenWait)
	}
	if c.loadTimeout < 0 {
		return fmt.Errorf("guarded: load timeout %v must not be negative", c.loadTimeout)
	}
	if c.fillWorkers < 1 {
		return fmt.Errorf("guarded: fill workers %d must be at least 1", c.fillWorkers)
	}
	if c.maxUnsettled < 0 || c.settleTime <= 0 {
		return fmt.Errorf("guarded: WithUnsettled(%d, %v): want at least 0 keys and a positive settle time", c.maxUnsettled, c.settleTime)
	}
	return nil
}
