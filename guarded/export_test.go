package guarded

import "time"

// withClock replaces time.Now, for tests.
func withClock(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}

// withoutUnsettled makes the Loader forget at once that an insert's
// outcome is unknown, as it did before it kept such keys through
// rebuilds: a mutation that TestLoaderStressWriteOutcomes must catch.
func withoutUnsettled() Option {
	return func(c *config) { c.forgetUnknown = true }
}
