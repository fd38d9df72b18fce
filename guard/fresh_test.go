package guard

import (
	"errors"
	"testing"
)

// TestFresh checks that a guard's configuration travels to its
// replacement: memory cap, shard count, grow threshold, workers and seed,
// with the options given on top, and that under a memory cap the
// replacement is sized to fit, or refused if the keys cannot fit.
func TestFresh(t *testing.T) {
	g, err := New(WithCapacity(1000), WithGrowThreshold(0.8), WithMaxBytes(1<<20), WithShards(3), WithGrowWorkers(2), WithSeed(42))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := range 500 {
		g.AddHash(uint64(i) * 0x9e3779b97f4a7c15)
	}
	ng, err := g.Fresh(2000)
	if err != nil {
		t.Fatal(err)
	}
	defer ng.Close()
	want := g.cfg
	want.capacity = 2000
	if ng.cfg != want || ng.Seed() != 42 || ng.Shards() != 3 || ng.Len() != 0 || ng.Capacity() != 2000 {
		t.Fatalf("Fresh(2000) = %+v (seed %d, %d shards, %d keys); want %+v", ng.cfg, ng.Seed(), ng.Shards(), ng.Len(), want)
	}
	if ng.cfg.maxBytes != 1<<20 || ng.cfg.growThreshold != 0.8 {
		t.Fatalf("the replacement lost its configuration: %+v", ng.cfg)
	}
	over, err := g.Fresh(4000, WithGrowThreshold(0.9))
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if over.cfg.growThreshold != 0.9 || over.cfg.maxBytes != 1<<20 {
		t.Fatalf("options on top: %+v", over.cfg)
	}

	// Under a cap that holds fewer keys than g has, Fresh refuses.
	small, err := New(WithCapacity(1000), WithShards(2))
	if err != nil {
		t.Fatal(err)
	}
	limit := small.Stats().Bytes + 1000
	small.Close()
	capped, err := New(WithCapacity(1000), WithShards(2), WithMaxBytes(limit))
	if err != nil {
		t.Fatal(err)
	}
	defer capped.Close()
	for i := 0; capped.Len() < 5000; i++ {
		if err := capped.AddHash(uint64(i) * 0x9e3779b97f4a7c15); err != nil {
			break
		}
	}
	if _, err := capped.Fresh(capped.Len() * 2); !errors.Is(err, ErrFull) {
		t.Fatalf("Fresh for %d keys under a cap of %d bytes = %v, want ErrFull", capped.Len()*2, limit, err)
	}
}
