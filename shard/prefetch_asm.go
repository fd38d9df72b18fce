//go:build amd64 || arm64

package shard

import "unsafe"

// prefetch asks the CPU to bring the n cache lines at addrs[0:n] into its
// caches, and returns without waiting for them: a prefetch instruction
// retires once the line is requested, where a load that misses holds the
// CPU's in-order retirement until its line arrives. So the misses of the
// items a Batch runs ahead are in flight while the CPU goes on with the
// compares of the items behind and the hashing of those ahead. A prefetch never faults
// and is no read in Go's memory model: the lookup's own atomic loads come
// after.
//
// The lines go to L2 (PREFETCHT1; PRFM PLDL2KEEP on arm64): measured at
// 100M keys on the 2-vCPU Xeon with the first pipeline (groups of 16),
// 46–51 ns per key
// against 50–63 into L1 (PREFETCHT0, six runs each; PREFETCHNTA 83–90;
// plain loads instead of prefetches 60–75, none at all 76–87).
//
//go:noescape
func prefetch(addrs *unsafe.Pointer, n int)
