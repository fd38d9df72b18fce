package guard

import (
	"math"
	"testing"
)

func TestNewRejectsInvalidOptions(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
	}{
		{"capacity 0", []Option{WithCapacity(0)}},
		{"capacity negative", []Option{WithCapacity(-5)}},
		{"shards 0", []Option{WithShards(0)}},
		{"shards negative", []Option{WithShards(-1)}},
		{"shards too many", []Option{WithShards(MaxShards + 1)}},
		{"capacity does not fit shards", []Option{WithShards(1), WithCapacity(MaxCapacity)}},
		{"threshold low", []Option{WithGrowThreshold(0.2)}},
		{"threshold high", []Option{WithGrowThreshold(0.99)}},
		{"threshold NaN", []Option{WithGrowThreshold(math.NaN())}},
	}
	if MaxCapacity < math.MaxInt { // 64-bit platforms
		tests = append(tests, struct {
			name string
			opts []Option
		}{"capacity too large", []Option{WithCapacity(int(min(MaxCapacity+1, math.MaxInt)))}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := New(tt.opts...)
			if err == nil || g != nil {
				t.Fatalf("New = %v, %v; want nil, error", g, err)
			}
			t.Logf("error: %v", err)
		})
	}
}

func TestNewAcceptsValidOptions(t *testing.T) {
	tests := []struct {
		name       string
		opts       []Option
		wantShards int
	}{
		{"defaults", nil, 0},
		{"one shard", []Option{WithShards(1)}, 1},
		{"odd shards", []Option{WithShards(23), WithCapacity(50_000)}, 23},
		{"max shards", []Option{WithShards(MaxShards), WithCapacity(1000)}, MaxShards},
		{"capacity 1", []Option{WithCapacity(1)}, 0},
		{"seed", []Option{WithSeed(42)}, 0},
		{"threshold", []Option{WithGrowThreshold(0.5)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustNew(t, tt.opts...)
			st := g.Stats()
			if tt.wantShards != 0 && st.Shards != tt.wantShards {
				t.Errorf("Shards = %d, want %d", st.Shards, tt.wantShards)
			}
			if err := g.AddString("k"); err != nil || !g.ContainsString("k") {
				t.Errorf("AddString/ContainsString on a new guard: %v", err)
			}
		})
	}
}

func TestSeedOption(t *testing.T) {
	a, b := mustNew(t, WithSeed(7)), mustNew(t, WithSeed(7))
	if a.Seed() != 7 || a.HashString("x") != b.HashString("x") {
		t.Errorf("guards with the same seed hash differently")
	}
	c, d := mustNew(t), mustNew(t)
	if c.Seed() == d.Seed() {
		t.Errorf("two default guards got the same seed %d", c.Seed())
	}
}
