//go:build amd64 || arm64

package shard

import "unsafe"

// prefetch asks the CPU to bring the n cache lines at addrs[0:n] into its
// caches, and returns without waiting for them: a prefetch instruction
// (PREFETCHT0, PRFM PLDL1KEEP) retires once the line is requested, where a
// load that misses holds the CPU's in-order retirement until its line
// arrives. So the misses of a whole group are in flight while the CPU goes
// on with the previous group's compares, bounded by the line fill buffers
// rather than by the reorder window. A prefetch never faults and is no
// read in Go's memory model: the lookup's own atomic loads come after.
//
//go:noescape
func prefetch(addrs *unsafe.Pointer, n int)
