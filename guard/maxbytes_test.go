package guard

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// TestMaxBytesHoldsAtEveryCap is the fourth case of issue 44: for guards
// of several sizes and shard counts, under the smallest cap New accepts
// and caps above it, random adds and removes run until many adds have
// failed with ErrFull. Stats().Bytes must stay within the cap after every
// add, and the guard's own snapshot must restore under guard.Like(g).
// (The cap left the shards' stashes out: at the smallest cap Bytes ended
// 56-728 bytes above it, and Restore refused the guard's snapshot.)
func TestMaxBytesHoldsAtEveryCap(t *testing.T) {
	seed := testrand.Seed(t)
	r := rand.New(rand.NewPCG(seed, 44))
	type config struct {
		capacity, shards int // shards 0: chosen by New
	}
	configs := []config{{1, 0}, {100, 0}, {1000, 0}, {5000, 0}, {20000, 0}, {1000, 1}, {3000, 3}}
	if testing.Short() {
		configs = configs[:4]
	}
	over, cases := 0, 0
	for _, c := range configs {
		opts := []Option{WithCapacity(c.capacity), WithSeed(r.Uint64())}
		if c.shards > 0 {
			opts = append(opts, WithShards(c.shards))
		}
		min := smallestCap(t, opts)
		for _, limit := range []int{min, min + 1, min + 57, min + min/10, min + min/2, 3 * min} {
			name := fmt.Sprintf("capacity=%d/shards=%d/cap=%d", c.capacity, c.shards, limit)
			t.Run(name, func(t *testing.T) {
				cases++
				if !capHolds(t, r, append(opts, WithMaxBytes(limit)), limit) {
					over++
				}
			})
		}
	}
	t.Logf("%d of %d caps were passed, or refused the guard's own snapshot", over, cases)
}

// smallestCap returns the smallest memory cap that New accepts for a guard
// made of opts.
func smallestCap(t *testing.T, opts []Option) int {
	t.Helper()
	g := mustNew(t, opts...)
	lo, hi := g.Stats().Bytes, 2*g.Stats().Bytes+1<<10 // New accepts hi
	g.Close()
	for lo < hi {
		mid := lo + (hi-lo)/2
		if g, err := New(append(opts, WithMaxBytes(mid))...); err == nil {
			g.Close()
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// capHolds adds and removes keys in a guard made of opts under cap limit
// until 200 adds have failed, checks Stats().Bytes against the cap after
// each add, and restores the guard's snapshot under Like(g). It reports
// whether both held.
func capHolds(t *testing.T, r *rand.Rand, opts []Option, limit int) bool {
	t.Helper()
	g := mustNew(t, opts...)
	var added []uint64
	ok := true
	for fails := 0; fails < 200; {
		if len(added) > 0 && r.IntN(8) == 0 {
			i := r.IntN(len(added))
			if !g.RemoveHash(added[i]) {
				t.Fatalf("RemoveHash of an added key = false")
			}
			added[i] = added[len(added)-1]
			added = added[:len(added)-1]
			continue
		}
		h := r.Uint64()
		switch err := g.AddHash(h); {
		case err == nil:
			added = append(added, h)
		case errors.Is(err, ErrFull):
			fails++
		case errors.Is(err, ErrTooManyCopies):
		default:
			t.Fatalf("AddHash: %v", err)
		}
		if b := settledBytes(g); b > limit {
			t.Errorf("after %d keys Stats().Bytes = %d, cap %d", len(added), b, limit)
			ok = false
			break
		}
	}
	var buf bytes.Buffer
	if _, err := g.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	rg, err := Restore(&buf, Like(g))
	if err != nil {
		t.Errorf("Restore(…, Like(g)) of the guard's own snapshot: %v", err)
		return false
	}
	defer rg.Close()
	if b := rg.Stats().Bytes; b > limit {
		t.Errorf("the restored guard takes %d bytes, cap %d", b, limit)
		ok = false
	}
	for _, h := range added {
		if !rg.ContainsHash(h) {
			t.Fatalf("the restored guard lost a key")
		}
	}
	// A rebuild under the same cap either takes every key or says ErrFull.
	if ng, err := g.Fresh(g.Len()); err == nil {
		if b := ng.Stats().Bytes; b > limit {
			t.Errorf("Fresh under the cap takes %d bytes, cap %d", b, limit)
		}
		ng.Close()
	} else if !errors.Is(err, ErrFull) {
		t.Errorf("Fresh(%d) under the cap: %v, want a guard or ErrFull", g.Len(), err)
	}
	return ok
}

// settledBytes returns Stats().Bytes, read again once no doubling runs if
// it is above the cap: a Stats that races with the end of a doubling may
// count the table it replaces, which the guard is about to drop.
func settledBytes(g *Guard) int {
	st := g.Stats()
	if st.MaxBytes == 0 || st.Bytes <= st.MaxBytes {
		return st.Bytes
	}
	for st.MigrationsInFlight+st.MigrationsQueued > 0 {
		runtime.Gosched()
		st = g.Stats()
	}
	return g.Stats().Bytes
}
