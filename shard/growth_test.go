package shard

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

func TestNewGrowthValidates(t *testing.T) {
	for _, tt := range []struct {
		threshold float64
		max       int64
	}{
		{MinGrowThreshold - 0.01, 0},
		{MaxGrowThreshold + 0.01, 0},
		{math.NaN(), 0},
		{DefaultGrowThreshold, -1},
	} {
		if g, err := NewGrowth(tt.threshold, tt.max); err == nil || g != nil {
			t.Errorf("NewGrowth(%v, %d) = %v, %v; want nil, error", tt.threshold, tt.max, g, err)
		}
	}
	for _, th := range []float64{MinGrowThreshold, DefaultGrowThreshold, MaxGrowThreshold} {
		if _, err := NewGrowth(th, 0); err != nil {
			t.Errorf("NewGrowth(%v, 0): %v", th, err)
		}
	}
}

// TestSetGrowthRefuses: a nil policy, a second policy and a cap that
// cannot hold the shard are errors, and leave the shard without a policy.
func TestSetGrowthRefuses(t *testing.T) {
	s := mustNew(t, 10)
	if err := s.SetGrowth(nil); err == nil {
		t.Fatal("SetGrowth(nil) succeeded")
	}
	small := mustGrowth(t, DefaultGrowThreshold, int64(s.ReservedBytes())-1)
	if err := s.SetGrowth(small); !errors.Is(err, ErrFull) || small.UsedBytes() != 0 {
		t.Fatalf("SetGrowth under a cap below the shard = %v (%d bytes reserved); want ErrFull and none", err, small.UsedBytes())
	}
	if s.growth != nil {
		t.Fatal("a refused SetGrowth left its policy on the shard")
	}
	g := mustGrowth(t, DefaultGrowThreshold, 0)
	if err := s.SetGrowth(g); err != nil {
		t.Fatal(err)
	}
	if got, want := g.UsedBytes(), int64(s.Stats().Bytes+stashBytes(StashSize)); got != want {
		t.Fatalf("UsedBytes = %d after SetGrowth, want the shard's %d and room for its stash", got, want)
	}
	if err := s.SetGrowth(g); err == nil || !strings.Contains(err.Error(), "already") {
		t.Fatalf("second SetGrowth = %v, want an error", err)
	}
}

// TestInsertGrowsUnderPolicy fills a 2-bucket shard with a growth policy
// far past its first table: every insert succeeds, the shard doubles as
// it needs, no item is lost, and the policy's reservation ends as the
// shard's memory, the old tables released.
func TestInsertGrowsUnderPolicy(t *testing.T) {
	s := mustNew(t, 1)
	g := mustGrowth(t, DefaultGrowThreshold, 0)
	if err := s.SetGrowth(g); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(testrand.Seed(t), 1))
	items := make([]item, 20_000)
	for i := range items {
		items[i] = item{f: uint8(r.IntN(255) + 1), v: r.Uint64()}
		if err := s.Insert(items[i].f, items[i].v); err != nil && !errors.Is(err, ErrTooManyCopies) {
			t.Fatalf("insert %d into a growing shard: %v", i, err)
		}
	}
	for _, it := range items {
		if !s.Contains(it.f, it.v) {
			t.Fatalf("false negative for %+v", it)
		}
	}
	st := s.Stats()
	if st.Doublings < 10 || st.Growing {
		t.Fatalf("after 20,000 inserts into 2 buckets: %+v", st)
	}
	if got, want := g.UsedBytes(), int64(s.ReservedBytes()); got != want || got < int64(shardBytes+tableBytes(st.Buckets)+stashBytes(StashSize)) {
		t.Fatalf("UsedBytes = %d, want the shard and its one table with its stash room, %d", got, want)
	}
}

// TestInsertRefusedByCap grows a shard under a memory cap until an insert
// fails: the error wraps ErrFull and names the cap, the refusal is
// counted, the reservation stays within the cap and no item is lost.
func TestInsertRefusedByCap(t *testing.T) {
	s := mustNew(t, 4)
	limit := int64(shardBytes + tableBytes(1<<8))
	g := mustGrowth(t, DefaultGrowThreshold, limit)
	if err := s.SetGrowth(g); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(testrand.Seed(t), 2))
	var items []item
	var err error
	for range 1 << 14 {
		it := item{f: uint8(r.IntN(255) + 1), v: r.Uint64()}
		if err = s.Insert(it.f, it.v); err != nil {
			if errors.Is(err, ErrTooManyCopies) {
				continue
			}
			break
		}
		items = append(items, it)
	}
	if !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), "memory cap") {
		t.Fatalf("inserts past the cap ended with %v, want ErrFull naming the memory cap", err)
	}
	if g.Refused() == 0 || g.UsedBytes() > limit || int64(s.Stats().Bytes) > g.UsedBytes() {
		t.Fatalf("Refused = %d, UsedBytes = %d of %d, Stats().Bytes %d", g.Refused(), g.UsedBytes(), limit, s.Stats().Bytes)
	}
	if st := s.Stats(); st.LoadFactor < MinGrowLoad || st.Buckets > 1<<7 {
		t.Fatalf("refused at %+v; want a full table, not past the cap", st)
	}
	for _, it := range items {
		if !s.Contains(it.f, it.v) {
			t.Fatalf("false negative for %+v", it)
		}
	}
}

// TestStashWithinReservation fills shards under a cap of exactly what
// SetGrowth reserves, and under caps a little above what each doubling
// needs, until inserts fail: the memory Stats counts, stashes included,
// never passes what the policy reserved, nor the cap. (SetGrowth reserved
// Stats().Bytes, an empty stash: a full one then passed the cap by 56
// bytes.)
func TestStashWithinReservation(t *testing.T) {
	r := rand.New(rand.NewPCG(testrand.Seed(t), 3))
	for _, k := range []int{1, 2, 4, 6} {
		for extra := range 4 {
			s := mustNew(t, k)
			limit := int64(ReserveFor(k)) + int64(extra)*int64(tableBytes(2<<k))/2
			g := mustGrowth(t, DefaultGrowThreshold, limit)
			if err := s.SetGrowth(g); err != nil {
				t.Fatalf("k=%d: SetGrowth under a cap of ReserveFor: %v", k, err)
			}
			stashed := 0
			for i := 0; i < 1<<14; i++ {
				it := randomItem(r)
				err := s.Insert(it.f, it.v)
				st := s.Stats()
				stashed = max(stashed, st.Stashed)
				if int64(st.Bytes) > g.UsedBytes() || g.UsedBytes() > limit {
					t.Fatalf("k=%d cap %d: after insert %d Stats().Bytes = %d, reserved %d (%+v)", k, limit, i, st.Bytes, g.UsedBytes(), st)
				}
				if errors.Is(err, ErrFull) {
					break
				}
			}
			if stashed == 0 {
				t.Errorf("k=%d cap %d: the stash was never used; the test needs a full table", k, limit)
			}
		}
	}
}

// TestInsertRefusesCrowd inserts items that share their fingerprint and
// both buckets: once they fill the two buckets and the stash, the shard,
// nearly empty, refuses to double for them (a doubling would not separate
// them, and would let them grow the shard without bound).
func TestInsertRefusesCrowd(t *testing.T) {
	const k = 10
	s := mustNew(t, k)
	g := mustGrowth(t, DefaultGrowThreshold, 0)
	if err := s.SetGrowth(g); err != nil {
		t.Fatal(err)
	}
	const f = 7
	var err error
	n := 0
	for tail := range uint64(1 << MaxTailBits) {
		// Bucket 5 and the same tail-less prefix: distinct slots, the same
		// two buckets.
		if err = s.Insert(f, 5<<(64-k)|tail<<(64-k-MaxTailBits)); err != nil {
			break
		}
		n++
	}
	if !errors.Is(err, errFullCrowded) {
		t.Fatalf("insert %d of a crowd = %v, want the crowded ErrFull", n+1, err)
	}
	if n != 2*slotsPerBucket+StashSize || s.Doublings() != 0 {
		t.Fatalf("the crowd took %d items and %d doublings; want %d and 0", n, s.Doublings(), 2*slotsPerBucket+StashSize)
	}
}

// TestGrowStepFollowsThreshold: GrowStep begins a doubling only for a
// shard that NeedsGrowth, past its policy's threshold, and runs it to the
// end; a shard without a policy is only stepped, never begun.
func TestGrowStepFollowsThreshold(t *testing.T) {
	s := mustNew(t, 8)
	r := rand.New(rand.NewPCG(testrand.Seed(t), 3))
	fill := func(load float64) {
		for s.LoadFactor() < load {
			if err := s.Insert(uint8(r.IntN(255)+1), r.Uint64()); err != nil {
				t.Fatal(err)
			}
		}
	}
	fill(0.85)
	if s.NeedsGrowth() || !s.GrowStep(DefaultChunk) || s.Doublings() != 0 {
		t.Fatal("a shard without a growth policy began a doubling")
	}
	if err := s.SetGrowth(mustGrowth(t, 0.9, 0)); err != nil {
		t.Fatal(err)
	}
	if s.NeedsGrowth() || !s.GrowStep(DefaultChunk) || s.Doublings() != 0 {
		t.Fatalf("a shard at load %.3f began a doubling under threshold 0.9", s.LoadFactor())
	}
	fill(0.9)
	if !s.NeedsGrowth() {
		t.Fatalf("NeedsGrowth = false at load %.3f", s.LoadFactor())
	}
	steps := 1
	for !s.GrowStep(16) {
		steps++
	}
	if s.Doublings() != 1 || steps != 1<<8/16 || s.NeedsGrowth() {
		t.Fatalf("after %d steps: %d doublings, NeedsGrowth %v; want 1 in %d steps, false", steps, s.Doublings(), s.NeedsGrowth(), 1<<8/16)
	}
}

// TestGrowForDoublesOnce checks that two inserts that found the same
// shard full double it once: the second sees the doubling count move and
// only retries.
func TestGrowForDoublesOnce(t *testing.T) {
	s := mustNew(t, 3)
	r := rand.New(rand.NewPCG(1, 2))
	for s.LoadFactor() < 0.8 { // growFor refuses a shard below MinGrowLoad
		if err := s.Insert(uint8(r.IntN(255)+1), r.Uint64()); err != nil {
			t.Fatal(err)
		}
	}
	d := s.Doublings()
	if err := s.growFor(d); err != nil {
		t.Fatalf("growFor(%d) = %v", d, err)
	}
	if err := s.growFor(d); err != nil || s.Doublings() != 1 {
		t.Fatalf("second growFor(%d) = %v with %d doublings; want nil and 1", d, err, s.Doublings())
	}
	if got := s.Stats().Buckets; got != 16 {
		t.Fatalf("Buckets = %d, want 16", got)
	}
	if started, err := s.beginGrow(); !started || err != nil {
		t.Fatalf("beginGrow() = %v, %v; want true, nil", started, err)
	}
	if started, err := s.beginGrow(); started || err != nil {
		t.Fatalf("second beginGrow() = %v, %v; want false, nil (already growing)", started, err)
	}
	if !s.Growing() {
		t.Fatalf("Growing() = false during a doubling")
	}
	for !s.GrowStep(3) {
	}
	if s.Growing() || s.Stats().Buckets != 32 || s.Doublings() != 2 {
		t.Fatalf("after the steps: %+v", s.Stats())
	}
}
