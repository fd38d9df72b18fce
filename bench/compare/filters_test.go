package compare

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
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

// TestMixWorker runs every benchmark mix on every filter from several
// goroutines (the peers behind their lock) and checks that no present key
// is lost, no add is refused and, for the filters that remove, that the
// filter ends with the keys it started with.
func TestMixWorker(t *testing.T) {
	const workers, ops = 4, 20_000
	keys := NewKeys(1 << 13)
	for _, mix := range []struct {
		name string
		m    Mix
	}{{"random", MixRandom}, {"ring", MixRing}, {"readonly", MixReadOnly}} {
		for _, im := range Impls {
			t.Run("mix="+mix.name+"/filter="+im.Name, func(t *testing.T) {
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
					wg.Go(func() { MixWorker(f, keys, mix.m, uint64(w+1), im.CanRemove, &countdown{ops}, &res) })
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
}

// recorder is a Filter that records the operations made on it.
type recorder struct {
	ops  []byte   // 'a'dd, 'r'emove, 'p'resent or 'n'ot present lookup
	keys []string // the key of each operation
	in   map[string]bool
}

func (r *recorder) op(o byte, k []byte) {
	r.ops = append(r.ops, o)
	r.keys = append(r.keys, string(k))
}

func (r *recorder) Add(k []byte) bool    { r.op('a', k); return true }
func (r *recorder) Remove(k []byte) bool { r.op('r', k); return true }
func (r *recorder) Contains(k []byte) bool {
	if r.in[string(k)] {
		r.op('p', k)
		return true
	}
	r.op('n', k)
	return false
}

// TestMixRingSchedule checks that MixRing does what issue 34 describes:
// one operation in 20 a write, adds and removes alternating once 257
// fresh keys are held, each remove taking the key added 256 adds before
// the latest one, adds cycling through a ring of 4,096 keys, and lookups
// alternating present and absent keys.
func TestMixRingSchedule(t *testing.T) {
	keys := NewKeys(1 << 10)
	r := &recorder{in: make(map[string]bool)}
	for i := range keys.N {
		r.in[string(keys.Present(i))] = true
	}
	const ops = 20 * 10_000 // 10,000 writes: more adds than the ring has keys
	MixWorker(r, keys, MixRing, 1, true, &countdown{ops}, new(MixResult))
	ops0 := len(r.ops) - ops // the removes after the loop
	var adds []string
	lastLookup := byte(0)
	for i, o := range r.ops[:ops] {
		write := o == 'a' || o == 'r'
		if want := (i+1)%20 == 0; write != want {
			t.Fatalf("op %d is %q, want a write: %v", i, o, want)
		}
		switch o {
		case 'a':
			adds = append(adds, r.keys[i])
			if n := len(adds); n > 4096 && adds[n-1] != adds[n-1-4096] {
				t.Fatalf("add %d is not the key added 4,096 adds earlier", n-1)
			} else if n > 1 && n <= 4096 && adds[n-1] == adds[n-2] {
				t.Fatalf("add %d repeats the previous key", n-1)
			}
		case 'r':
			n := len(adds)
			if n < 257 {
				t.Fatalf("op %d removes with %d keys added, want adds only until 257", i, n)
			}
			if r.keys[i] != adds[n-1-256] {
				t.Fatalf("op %d removes a key other than the one added 256 adds before the latest", i)
			}
			if r.ops[i-20] != 'a' {
				t.Fatalf("op %d removes after a remove, want adds and removes alternating", i)
			}
		default:
			if o == lastLookup {
				t.Fatalf("op %d looks up a key of the same set as the lookup before", i)
			}
			lastLookup = o
		}
	}
	const writes = ops / 20
	wantAdds := 257 + (writes-257)/2 // 257 adds, then remove, add, remove, …
	if len(adds) != wantAdds {
		t.Errorf("%d adds, want %d", len(adds), wantAdds)
	}
	if held := 2*wantAdds - writes; ops0 != held {
		t.Errorf("%d removes after the loop, want %d", ops0, held)
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

// TestHandoff checks that Handoff measures with two threads and reports 0
// with one.
func TestHandoff(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	if ns := Handoff(time.Millisecond); ns != 0 {
		t.Errorf("Handoff with GOMAXPROCS 1 = %v ns, want 0", ns)
	}
	runtime.GOMAXPROCS(2)
	if ns := Handoff(5 * time.Millisecond); !(ns > 0) {
		t.Errorf("Handoff with GOMAXPROCS 2 = %v ns, want > 0", ns)
	}
}
