package resize

import (
	"fmt"
	"runtime"
)

// DefaultWorkers returns the default bound on concurrent migrations: one
// per 4 cores (GOMAXPROCS), at least 1.
func DefaultWorkers() int {
	return max(1, runtime.GOMAXPROCS(0)/4)
}

// Option configures a Resizer made by [New].
type Option func(*config)

type config struct {
	workers int
	chunk   int
}

// WithWorkers sets how many shards may migrate at the same time, at least
// 1. The default is [DefaultWorkers].
func WithWorkers(n int) Option {
	return func(c *config) { c.workers = n }
}

func (c *config) validate() error {
	if c.workers < 1 {
		return fmt.Errorf("resize: workers %d must be at least 1", c.workers)
	}
	if c.chunk < 1 {
		return fmt.Errorf("resize: chunk %d must be at least 1 bucket", c.chunk)
	}
	return nil
}
