package compare

import "testing"

// TestConcurrentMarker checks that exactly the filters whose Impl says
// they are safe for concurrent use are filled and checked from several
// goroutines (concurrent), so that no filter that needs a lock is.
func TestConcurrentMarker(t *testing.T) {
	for _, im := range append([]Impl{guardGrow}, Impls...) {
		_, marked := im.New(1024).(concurrent)
		if marked != im.Concurrent {
			t.Errorf("%s: implements concurrent: %v, want Impl.Concurrent = %v", im.Name, marked, im.Concurrent)
		}
	}
}

// TestInParallel checks that inParallel covers [0, n) exactly once, for
// sizes below, at and above one range per CPU.
func TestInParallel(t *testing.T) {
	for _, n := range []int{0, 1, 1023, 1024, 5000, 1 << 16} {
		seen := make([]int32, n)
		inParallel(n, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				seen[i]++ // ranges are disjoint: no race
			}
		})
		for i, c := range seen {
			if c != 1 {
				t.Fatalf("n=%d: index %d covered %d times, want 1", n, i, c)
			}
		}
	}
}
