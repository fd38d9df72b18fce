package shard

import (
	"math/rand/v2"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// TestHugePagesFollowPolicy checks when a shard's tables are advised to be
// backed by huge pages: the tables of a shard told to (AdviseHugePages) and
// every table its doublings make, and the tables that doublings make under
// a growth policy holding HugePagesMin bytes; not the tables of a shard
// under a smaller policy, nor those of a shard without one.
func TestHugePagesFollowPolicy(t *testing.T) {
	huge := func(s *Shard) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.tab.Load().huge
	}
	grown := func(t *testing.T, s *Shard) *Shard {
		t.Helper()
		if err := s.Grow(); err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("no policy", func(t *testing.T) {
		s := mustNew(t, 4)
		if huge(grown(t, s)) {
			t.Fatal("a doubled shard without a policy asked for huge pages")
		}
	})
	t.Run("small policy", func(t *testing.T) {
		s := mustNew(t, 4)
		if err := s.SetGrowth(mustGrowth(t, DefaultGrowThreshold, 0)); err != nil {
			t.Fatal(err)
		}
		if huge(grown(t, s)) {
			t.Fatal("a shard under a policy of a few bytes asked for huge pages")
		}
	})
	t.Run("large policy", func(t *testing.T) {
		s := mustNew(t, 4)
		g := mustGrowth(t, DefaultGrowThreshold, 0)
		if err := g.Reserve(HugePagesMin); err != nil {
			t.Fatal(err)
		}
		if err := s.SetGrowth(g); err != nil {
			t.Fatal(err)
		}
		if huge(s) {
			t.Fatal("a shard's first table asked for huge pages by itself")
		}
		if !huge(grown(t, s)) {
			t.Fatal("a doubling under a policy of HugePagesMin bytes did not ask for huge pages")
		}
	})
	t.Run("advised", func(t *testing.T) {
		s := mustNew(t, 4)
		s.AdviseHugePages()
		if !huge(s) {
			t.Fatal("AdviseHugePages did not mark the table")
		}
		if !huge(grown(t, s)) {
			t.Fatal("the doubling of an advised shard did not ask for huge pages")
		}
	})
}

// TestAdviseHugePagesKeepsEntries checks that the advice, a collapse of a
// filled table's memory into huge pages included, loses no entry.
func TestAdviseHugePagesKeepsEntries(t *testing.T) {
	r := rand.New(rand.NewPCG(testrand.Seed(t), 11))
	for _, grow := range []bool{false, true} {
		s := mustNew(t, 16) // 512 KiB, whole pages
		model := map[item]int{}
		for s.LoadFactor() < 0.8 {
			it := randomItem(r)
			if err := s.Insert(it.f, it.v); err != nil {
				t.Fatal(err)
			}
			model[it]++
		}
		if grow {
			// Mid-doubling: both tables hold entries.
			if ok, err := s.beginGrow(); !ok || err != nil {
				t.Fatalf("beginGrow = %v, %v", ok, err)
			}
			s.GrowStep(len(s.tab.Load().buckets) / 2)
		}
		s.AdviseHugePages()
		checkAll(t, s, model, "after AdviseHugePages")
		for s.Growing() {
			s.GrowStep(DefaultChunk)
		}
		checkAll(t, s, model, "after the doubling")
	}
}
