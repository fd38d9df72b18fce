package guard

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// TestContainsManyAgrees checks that ContainsMany and its variants answer
// exactly as Contains does, key for key, for batches of 0, 1, odd and
// larger sizes, on a guard that grew (mixed tail lengths, void copies) and
// one that did not.
func TestContainsManyAgrees(t *testing.T) {
	for _, capacity := range []int{100, 100_000} {
		t.Run(fmt.Sprintf("capacity=%d", capacity), func(t *testing.T) {
			g := mustNew(t, WithCapacity(capacity), WithSeed(testrand.Seed(t)))
			for i := range 50_000 {
				if err := g.AddString(strconv.Itoa(i)); err != nil {
					t.Fatal(err)
				}
			}
			r := rand.New(rand.NewPCG(1, 2))
			for _, n := range []int{0, 1, 2, 15, 16, 17, 33, 1000} {
				keys := make([]string, n)
				bkeys := make([][]byte, n)
				hashes := make([]uint64, n)
				for i := range keys {
					keys[i] = strconv.Itoa(r.IntN(100_000)) // half present
					bkeys[i] = []byte(keys[i])
					hashes[i] = g.HashString(keys[i])
				}
				out, outB, outH := make([]bool, n), make([]bool, n), make([]bool, n)
				g.ContainsManyStrings(keys, out)
				g.ContainsMany(bkeys, outB)
				g.ContainsManyHashes(hashes, outH)
				for i, k := range keys {
					want := g.ContainsString(k)
					if out[i] != want || outB[i] != want || outH[i] != want {
						t.Fatalf("batch of %d, key %d (%q): ContainsMany = %v, %v, %v; Contains = %v", n, i, k, out[i], outB[i], outH[i], want)
					}
					if n, _ := strconv.Atoi(k); n < 50_000 && !want {
						t.Fatalf("false negative for %q", k)
					}
				}
			}
			if st := g.Stats(); capacity == 100 && st.MaxDoublings < 5 {
				t.Fatalf("the small guard doubled only %d times", st.MaxDoublings)
			}
		})
	}
}

func TestContainsManyDoesNotAllocate(t *testing.T) {
	g := mustNew(t, WithCapacity(1000))
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = strconv.Itoa(i)
	}
	out := make([]bool, len(keys))
	if n := testing.AllocsPerRun(100, func() { g.ContainsManyStrings(keys, out) }); n != 0 {
		t.Fatalf("ContainsManyStrings allocates %v times", n)
	}
}

// TestContainsManyConcurrent runs batch lookups of keys that stay added
// while other goroutines add and remove keys and the guard doubles: a key
// that stays must never read absent in a batch.
func TestContainsManyConcurrent(t *testing.T) {
	seed := testrand.Seed(t)
	g := mustNew(t, WithCapacity(1000), WithSeed(seed))
	const stable = 5000
	keys := make([]string, stable)
	for i := range keys {
		keys[i] = "stable/" + strconv.Itoa(i)
		if err := g.AddString(keys[i]); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var grower, churner, readers sync.WaitGroup
	grower.Go(func() { // grows the guard past several doublings
		for i := range 200_000 {
			if err := g.AddString("grow/" + strconv.Itoa(i)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	churner.Go(func() { // churns: add and remove
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := "churn/" + strconv.Itoa(i)
			if err := g.AddString(k); err != nil {
				t.Error(err)
				return
			}
			if !g.RemoveString(k) {
				t.Error("remove of an added key failed")
				return
			}
		}
	})
	var batches atomic.Int64
	for rd := range 2 {
		readers.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(rd)))
			out := make([]bool, 257)
			batch := make([]string, 257)
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := r.IntN(len(batch) + 1)
				for i := range n {
					batch[i] = keys[r.IntN(stable)]
				}
				g.ContainsManyStrings(batch[:n], out)
				for i := range n {
					if !out[i] {
						t.Errorf("ContainsManyStrings: false negative for %q", batch[i])
						return
					}
				}
				batches.Add(1)
			}
		})
	}
	// The grower finishes on its own; then the churner and readers stop.
	grower.Wait()
	close(stop)
	churner.Wait()
	readers.Wait()
	t.Logf("%d batches, %d doublings", batches.Load(), g.Stats().Doublings)
}

// FuzzContainsMany decodes keys from the input, adds every other one, and
// checks that a batch lookup of all of them agrees with Contains.
func FuzzContainsMany(f *testing.F) {
	f.Add([]byte("\x03abc\x00\x05hello\x01x"), uint64(1))
	f.Add([]byte(""), uint64(2))
	f.Fuzz(func(t *testing.T, data []byte, seed uint64) {
		g, err := New(WithCapacity(16), WithSeed(seed))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		var keys [][]byte
		for len(data) > 0 && len(keys) < 4096 {
			n := min(int(data[0]%32), len(data)-1)
			keys = append(keys, data[1:1+n])
			data = data[1+n:]
		}
		added := make([]bool, len(keys))
		for i, k := range keys {
			if i%2 != 0 {
				continue
			}
			switch err := g.Add(k); {
			case err == nil, errors.Is(err, ErrTooManyCopies): // present either way
				added[i] = true
			case errors.Is(err, ErrFull): // not added: colliding keys crowd it out
			default:
				t.Fatal(err)
			}
		}
		out := make([]bool, len(keys))
		g.ContainsMany(keys, out)
		for i, k := range keys {
			if out[i] != g.Contains(k) {
				t.Fatalf("key %d %q: ContainsMany = %v, Contains = %v", i, k, out[i], !out[i])
			}
			if added[i] && !out[i] {
				t.Fatalf("false negative for added key %q", k)
			}
		}
	})
}
