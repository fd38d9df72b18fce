package guarded

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/guard"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
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
