package compare

import (
	"fmt"
	"sync"
	"testing"
)

// testN is the size the adapters are checked at.
const testN = 10_000

// TestAdapters checks that every filter keeps every added key, answers
// absent keys mostly absent, reports its memory, and, if it can remove,
// removes exactly the keys it holds.
func TestAdapters(t *testing.T) {
	keys := NewKeys(testN)
	for _, im := range Impls {
		t.Run(im.Name, func(t *testing.T) {
			f := im.New(testN)
			if err := Fill(f, keys); err != nil {
				t.Fatal(err)
			}
			if miss := FalseNegatives(f, keys); miss > 0 {
				t.Fatalf("%d false negatives of %d keys", miss, testN)
			}
			if fpr := MeasureFPR(f, keys, testN); fpr > 0.05 {
				t.Errorf("fpr = %v on %d absent keys, want ≤ 0.05 (8-bit fingerprints give ~2 %%)", fpr, testN)
			}
			if bits := im.BitsPerItem(f, testN); !(bits > 8 && bits < 64) {
				t.Errorf("bits/item = %v, want in (8, 64)", bits)
			}
			if !im.CanRemove {
				return
			}
			for i := 0; i < testN; i += 2 {
				if !f.Remove(keys.Present(i)) {
					t.Fatalf("remove of present key %d found nothing", i)
				}
			}
			for i := 1; i < testN; i += 2 {
				if !f.Contains(keys.Present(i)) {
					t.Fatalf("key %d lost after removing others", i)
				}
			}
		})
	}
}

// countdown is a Nexter that stops after n calls.
type countdown struct{ n int }

func (c *countdown) Next() bool { c.n--; return c.n >= 0 }

// TestMixWorker runs the benchmark mix on every filter from several
// goroutines (the peers behind their lock) and checks that no present key
// is lost, no add is refused and, for the filters that remove, that the
// filter ends with the keys it started with.
func TestMixWorker(t *testing.T) {
	const workers, ops = 4, 20_000
	keys := NewKeys(1 << 13)
	for _, im := range Impls {
		t.Run(im.Name, func(t *testing.T) {
			var f Filter = im.New(keys.N)
			if err := Fill(f, keys); err != nil {
				t.Fatal(err)
			}
			if !im.Concurrent {
				f = NewLocked(f)
			}
			var res MixResult
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() { MixWorker(f, keys, uint64(w+1), im.CanRemove, &countdown{ops}, &res) })
			}
			wg.Wait()
			if got := res.Ops.Load(); got != workers*ops {
				t.Errorf("ops = %d, want %d", got, workers*ops)
			}
			if fn, rf, rm := res.FalseNegatives.Load(), res.Refused.Load(), res.RemoveMisses.Load(); fn+rf+rm > 0 {
				t.Errorf("%d false negatives, %d adds refused, %d removes missed", fn, rf, rm)
			}
			if miss := FalseNegatives(f, keys); miss > 0 {
				t.Errorf("%d false negatives after the mix", miss)
			}
			if g, ok := f.(guardFilter); ok {
				if got := g.g.Len(); got != keys.N {
					t.Errorf("guard holds %d keys after the mix, want %d", got, keys.N)
				}
			}
		})
	}
}

// TestKeysDistinct checks that present, absent and fresh keys differ.
func TestKeysDistinct(t *testing.T) {
	keys := NewKeys(1 << 12)
	seen := make(map[string]string, 3*keys.N)
	fresh := make([]byte, KeySize)
	for i := range keys.N {
		PutKey(fresh, FreshBase+uint64(i))
		for _, k := range []struct {
			name string
			key  []byte
		}{{"present", keys.Present(i)}, {"absent", keys.Absent(i)}, {"fresh", fresh}} {
			id := fmt.Sprintf("%s %d", k.name, i)
			if prev, dup := seen[string(k.key)]; dup {
				t.Fatalf("%s and %s are the same key", prev, id)
			}
			seen[string(k.key)] = id
		}
	}
}
