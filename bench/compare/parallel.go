package compare

import (
	"runtime"
	"sync"
)

// inParallel runs fn on [0, n) split into one contiguous range per CPU,
// each in its own goroutine, and returns when all have returned. It is for
// the untimed setup of the benchmarks (making keys, filling filters),
// which at 2^27 keys would take minutes on one core: it raises GOMAXPROCS
// to runtime.NumCPU() for its duration if -cpu has set it lower, and puts
// it back before returning, so that a benchmark run at -cpu=1 still makes
// its filters on every core.
func inParallel(n int, fn func(lo, hi int)) {
	cpus := runtime.NumCPU()
	if prev := runtime.GOMAXPROCS(0); prev < cpus {
		runtime.GOMAXPROCS(cpus)
		defer runtime.GOMAXPROCS(prev)
	}
	parts := max(min(cpus, n/1024), 1) // small sets: not worth a goroutine each
	var wg sync.WaitGroup
	for p := range parts {
		lo, hi := p*n/parts, (p+1)*n/parts
		wg.Go(func() { fn(lo, hi) })
	}
	wg.Wait()
}

// concurrent is implemented by the filters that are safe for concurrent
// use as they are (those whose [Impl.Concurrent] is true): [Fill] and
// [FalseNegatives] run on every CPU for them.
type concurrent interface {
	Filter
	safeForConcurrentUse()
}

func (guardFilter) safeForConcurrentUse()     {}
func (blobloomFilter) safeForConcurrentUse()  {}
func (*shardedPanmari) safeForConcurrentUse() {}
