//go:build race

package testrand

// Race reports whether the race detector is on. Tests that measure rather
// than race (false-positive rates over millions of probes) run smaller
// under it: it slows them tenfold and checks nothing they do.
const Race = true
