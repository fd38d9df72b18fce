//go:build !amd64 && !arm64

package shard

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// prefetch brings the n buckets at addrs[0:n] into the caches with plain
// loads, as Go has no prefetch instruction: the loads are independent, so
// their misses overlap as far as the CPU reorders, though each holds its
// retirement until its line arrives.
func prefetch(addrs *unsafe.Pointer, n int) {
	var x uint64
	for _, p := range unsafe.Slice(addrs, n) {
		x ^= atomic.LoadUint64((*uint64)(p))
	}
	// Keep the loads alive without a store that concurrent batches
	// would race on.
	runtime.KeepAlive(x)
}
