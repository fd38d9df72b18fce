package resize

import (
	"fmt"
	"runtime"
)

// Defaults of the options.
const (
	// DefaultGrowThreshold is the load factor at which a shard is queued
	// for doubling.
	DefaultGrowThreshold = 0.9
	// MinGrowLoad is the load factor below which [Resizer.GrowNow]
	// refuses to double a shard (see ErrCrowded). Items with random
	// positions fill a (2,4)-cuckoo table to about 0.95 before an insert
	// fails.
	MinGrowLoad = 0.5
)

// DefaultWorkers returns the default bound on concurrent migrations: one
// per 4 cores (GOMAXPROCS), at least 1.
func DefaultWorkers() int {
	return max(1, runtime.GOMAXPROCS(0)/4)
}

// Option configures a Resizer made by [New].
type Option func(*config)

type config struct {
	threshold float64
	workers   int
	chunk     int
	maxBytes  int64 // 0: no cap
	usedBytes int64
}

// WithGrowThreshold sets the load factor, in (0, 1), at which a shard is
// queued for doubling. The default is [DefaultGrowThreshold].
func WithGrowThreshold(load float64) Option {
	return func(c *config) { c.threshold = load }
}

// WithWorkers sets how many shards may migrate at the same time, at least
// 1. The default is [DefaultWorkers].
func WithWorkers(n int) Option {
	return func(c *config) { c.workers = n }
}

// WithMaxBytes caps the memory of the shards' tables at max bytes, of
// which used are in use when the Resizer starts. A doubling that would
// pass the cap (counting the old and the new table while it runs) is
// refused. max must be at least used.
func WithMaxBytes(max, used int64) Option {
	return func(c *config) { c.maxBytes, c.usedBytes = max, used }
}

func (c *config) validate() error {
	if !(c.threshold > 0 && c.threshold < 1) {
		return fmt.Errorf("resize: threshold %v out of range (0, 1)", c.threshold)
	}
	if c.workers < 1 {
		return fmt.Errorf("resize: workers %d must be at least 1", c.workers)
	}
	if c.chunk < 1 {
		return fmt.Errorf("resize: chunk %d must be at least 1 bucket", c.chunk)
	}
	if c.maxBytes < 0 || c.usedBytes < 0 || c.maxBytes != 0 && c.maxBytes < c.usedBytes {
		return fmt.Errorf("resize: memory cap %d bytes is below the %d bytes in use", c.maxBytes, c.usedBytes)
	}
	return nil
}
