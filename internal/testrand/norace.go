//go:build !race

package testrand

// Race reports whether the race detector is on.
const Race = false
