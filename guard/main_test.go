package guard

import (
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testSeed returns the seed for a randomized test: CUCKOOGUARD_SEED if set,
// else the clock. It is logged so that a failure can be replayed.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CUCKOOGUARD_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CUCKOOGUARD_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with CUCKOOGUARD_SEED=%d)", seed, seed)
	return seed
}

func mustNew(t testing.TB, opts ...Option) *Guard {
	t.Helper()
	g, err := New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}
