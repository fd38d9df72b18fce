package guard

import (
	"bytes"
	"math"
	"strings"
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
		{"nil option", []Option{nil}},
		{"nil option after a valid one", []Option{WithCapacity(10), nil}},
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

// TestNilArguments: every function of the package that returns an error
// returns one for a nil argument, naming it, instead of panicking (the
// first-hour issue: guard.New(nil) panicked).
func TestNilArguments(t *testing.T) {
	g := mustNew(t)
	var snap bytes.Buffer
	if _, err := g.WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, want string
		call       func() error
	}{
		{"New(nil)", "option 1 of 1 is nil", func() error { _, err := New(nil); return err }},
		{"Restore(nil reader)", "reader", func() error { _, err := Restore(nil); return err }},
		{"Restore(r, nil)", "option 1 of 1 is nil", func() error { _, err := Restore(bytes.NewReader(snap.Bytes()), nil); return err }},
		{"Fresh(n, nil)", "option 1 of 1 is nil", func() error { _, err := g.Fresh(100, nil); return err }},
		{"WriteTo(nil)", "writer", func() error { _, err := g.WriteTo(nil); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%s = %v, want an error that says %q", tt.name, err, tt.want)
			}
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

// TestLike: a guard restored with Like(g) has g's threshold, cap and
// workers, and keeps the snapshot's seed.
func TestLike(t *testing.T) {
	g := mustNew(t, WithCapacity(1000), WithGrowThreshold(0.6), WithMaxBytes(1<<20), WithGrowWorkers(3), WithSeed(9))
	other := mustNew(t, WithCapacity(1000), WithSeed(5))
	var snap bytes.Buffer
	if _, err := other.WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	r, err := Restore(&snap, Like(g))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.cfg.growThreshold != 0.6 || r.cfg.maxBytes != 1<<20 || r.cfg.workers != 3 || !r.cfg.workersSet {
		t.Fatalf("restored config %+v, want g's threshold, cap and workers", r.cfg)
	}
	if r.Seed() != 5 {
		t.Fatalf("restored seed %d, want the snapshot's 5", r.Seed())
	}
}
