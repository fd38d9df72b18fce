package guarded

import "time"

// withClock replaces time.Now, for tests.
func withClock(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}
