package compare

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Handoff returns the time, in nanoseconds, that one cache line takes to
// go from one core to another and be written there: two goroutines on
// two threads take turns writing one counter for about d. It is what a
// write costs the next core that reads or writes the same line, so it
// sets how much a mix of writes slows concurrent operations. On a virtual
// machine it depends on where the host runs the virtual CPUs, and it can
// change while the machine runs (on a 2-vCPU VM, about 27 ns or about
// 165 ns, from one minute to the next): the parallel benchmarks report
// it, so that a result says which machine it had. It returns 0 if
// GOMAXPROCS is 1.
func Handoff(d time.Duration) float64 {
	if runtime.GOMAXPROCS(0) < 2 {
		return 0
	}
	const warm = 1 << 12  // turns before the clock starts
	var turn atomic.Int64 // even: the first goroutine's turn, odd: the second's; -1: stop
	var start time.Time
	var ns float64
	var wg sync.WaitGroup
	for p := range int64(2) {
		wg.Go(func() {
			runtime.LockOSThread() // two threads, whatever else runs
			defer runtime.UnlockOSThread()
			for i := p; ; i += 2 {
				for t := turn.Load(); t != i; t = turn.Load() {
					if t < 0 {
						return
					}
				}
				if p == 0 && i%1024 == 0 {
					switch {
					case i == warm:
						start = time.Now()
					case i > warm && time.Since(start) >= d:
						ns = float64(time.Since(start).Nanoseconds()) / float64(i-warm)
						turn.Store(-1)
						return
					}
				}
				turn.Store(i + 1)
			}
		})
	}
	wg.Wait()
	return ns
}
