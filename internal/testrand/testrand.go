// Package testrand gives randomized tests a seed that they log, so that a
// failure can be replayed.
package testrand

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Seed returns the seed for a randomized test: the value of the
// CUCKOOGUARD_SEED environment variable if it is set, else the clock. It
// logs the seed with the command line that replays it.
func Seed(t testing.TB) uint64 {
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
