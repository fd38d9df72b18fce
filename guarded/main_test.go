package guarded

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/internal/testrand"

	"github.com/cuckooguard/cuckooguard/guard"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testSeed returns the seed for a randomized test and logs it.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	return testrand.Seed(t)
}

func mustNew(t testing.TB, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g, err := guard.New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}
