package guard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"time"
)

// Defaults of the Loader options.
const (
	// DefaultMaxFPR is the estimated false-positive rate above which a
	// Loader rebuilds its guard from the key source.
	DefaultMaxFPR = 0.01
	// DefaultLoadTimeout is 0: a shared store lookup gets no deadline of its
	// own (see WithLoadTimeout for why).
	DefaultLoadTimeout = 0
	// DefaultFillBatch is the number of keys Fill hands a worker at once.
	DefaultFillBatch = 4096
)

// LoaderOption configures a [Loader] made by [NewLoader].
type LoaderOption func(*loaderConfig)

type loaderConfig struct {
	keyBytes    any // func(K) []byte, checked in NewLoader
	keySource   any // func(context.Context) iter.Seq2[K, error]
	batch       any // func(context.Context, []K) (map[K]V, error)
	isNotFound  func(error) bool
	notWritten  func(error) bool
	negSize     int
	negTTL      time.Duration
	maxFPR      float64
	loadTimeout time.Duration
	progress    func(added int64)
	logger      *slog.Logger
	fillWorkers int
	guardOpts   []Option
	now         func() time.Time
}

// WithKeyBytes sets how keys of type K become bytes for hashing and for
// coalescing loads. Keys whose underlying type is a string, an integer or a
// byte array work without it; other key types need it. The bytes must be
// equal exactly when the keys are.
func WithKeyBytes[K comparable](encode func(K) []byte) LoaderOption {
	return func(c *loaderConfig) { c.keyBytes = encode }
}

// WithKeySource sets where a rebuild reads every key of the store, for
// example `SELECT id FROM users`. Without it a Loader cannot rebuild: a
// shard that refused a key (ErrFull) then passes its lookups through for good.
func WithKeySource[K comparable](source func(ctx context.Context) iter.Seq2[K, error]) LoaderOption {
	return func(c *loaderConfig) { c.keySource = source }
}

// WithBatchLookup sets the store lookup that [Loader.GetMany] uses for the
// keys the guard lets through: one call for all of them, for example one
// SELECT … WHERE id = ANY($1). It returns the rows it found, by key; a
// key missing from the map is not in the store (ErrNotFound), and an
// error fails every key of the call. Without it GetMany looks the keys up
// one at a time. The types must be those of the Loader's keys and values;
// NewLoader checks.
func WithBatchLookup[K comparable, V any](lookup func(ctx context.Context, keys []K) (map[K]V, error)) LoaderOption {
	return func(c *loaderConfig) { c.batch = lookup }
}

// WithNotFound sets how a Loader recognizes the store's "not found" error,
// besides [ErrNotFound], which it always recognizes. The default
// recognizes [sql.ErrNoRows] with [errors.Is].
func WithNotFound(isNotFound func(error) bool) LoaderOption {
	return func(c *loaderConfig) { c.isNotFound = isNotFound }
}

// WithRollback sets how [Loader.Insert] decides, from its write's error,
// that the write certainly changed nothing, so that the key may leave the
// guard again: notWritten reports true only for such errors. An error for
// which it reports false keeps the key in the guard, a possible false
// positive; reporting true for a write that did commit would make its row
// read absent, a false negative, so when in doubt report false. The
// default is [NotWritten].
func WithRollback(notWritten func(err error) bool) LoaderOption {
	return func(c *loaderConfig) { c.notWritten = notWritten }
}

// WithNegativeCache remembers, for ttl, up to size keys that the guard let
// through but the store did not have (false positives), so that repeated
// lookups of the same absent key do not reach the store every time. A key
// inserted through [Loader.Insert] leaves the cache at once. Off by
// default. Each entry costs about 64 bytes plus the key.
func WithNegativeCache(size int, ttl time.Duration) LoaderOption {
	return func(c *loaderConfig) { c.negSize, c.negTTL = size, ttl }
}

// WithMaxFPR sets the estimated false-positive rate, in (0, 1], above which
// the Loader rebuilds its guard from the key source (growth halves the
// fingerprint tail and raises the rate). The default is [DefaultMaxFPR].
func WithMaxFPR(rate float64) LoaderOption {
	return func(c *loaderConfig) { c.maxFPR = rate }
}

// WithLoadTimeout bounds one store lookup shared by coalesced callers.
// The shared lookup runs without the first caller's cancellation, so that
// one caller leaving does not fail the others; with d > 0 it also gets a
// deadline of d. Callers never wait longer than their own ctx allows
// either way. The default, 0, adds no deadline and relies on the store's
// own timeouts: a cancellable context per lookup cost 40% of the
// throughput of in-process SQLite lookups in the bench load test (database/sql
// then starts and wakes a watcher goroutine per query).
func WithLoadTimeout(d time.Duration) LoaderOption {
	return func(c *loaderConfig) { c.loadTimeout = d }
}

// WithFillProgress calls progress with the number of keys added so far,
// after every batch of a Fill or a rebuild. It is called from several
// goroutines, never concurrently.
func WithFillProgress(progress func(added int64)) LoaderOption {
	return func(c *loaderConfig) { c.progress = progress }
}

// WithLogger sets where the Loader logs fills, rebuilds and failed
// rebuilds. By default it logs nothing: a library speaks only when asked.
func WithLogger(l *slog.Logger) LoaderOption {
	return func(c *loaderConfig) { c.logger = l }
}

// WithFillWorkers sets how many goroutines a Fill uses to add keys, at
// least 1. The default is GOMAXPROCS.
func WithFillWorkers(n int) LoaderOption {
	return func(c *loaderConfig) { c.fillWorkers = n }
}

// WithRebuildOptions changes the options of the guards a rebuild makes.
// A rebuilt guard has the configuration of the guard it replaces (memory
// cap, shard count, grow threshold, grow workers and seed), so most
// Loaders need no rebuild options; opts apply on top of it. The seed and
// the capacity are chosen by the rebuild: the capacity is the keys the old
// guard holds and a quarter more, at least its own capacity.
func WithRebuildOptions(opts ...Option) LoaderOption {
	return func(c *loaderConfig) { c.guardOpts = opts }
}

// withClock replaces time.Now, for tests.
func withClock(now func() time.Time) LoaderOption {
	return func(c *loaderConfig) { c.now = now }
}

func defaultIsNotFound(err error) bool {
	return errors.Is(err, sql.ErrNoRows) || errors.Is(err, ErrNotFound)
}

// discardLogger is the Loader's logger unless WithLogger sets one.
var discardLogger = slog.New(slog.DiscardHandler)

func (c *loaderConfig) validate() error {
	if c.notWritten == nil || c.isNotFound == nil || c.logger == nil {
		return errors.New("guard: WithRollback, WithNotFound and WithLogger need a non-nil argument")
	}
	if c.negSize < 0 || c.negSize > 0 && c.negTTL <= 0 {
		return fmt.Errorf("guard: negative cache of %d keys for %v is invalid", c.negSize, c.negTTL)
	}
	if !(c.maxFPR > 0 && c.maxFPR <= 1) {
		return fmt.Errorf("guard: max FPR %v out of range (0, 1]", c.maxFPR)
	}
	if c.loadTimeout < 0 {
		return fmt.Errorf("guard: load timeout %v must not be negative", c.loadTimeout)
	}
	if c.fillWorkers < 1 {
		return fmt.Errorf("guard: fill workers %d must be at least 1", c.fillWorkers)
	}
	return nil
}
