package guard

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// benchKeys returns n 16-byte keys, n a power of two.
func benchKeys(n int, salt uint64) [][]byte {
	keys := make([][]byte, n)
	buf := make([]byte, 16*n)
	for i := range keys {
		k := buf[16*i : 16*i+16 : 16*i+16]
		binary.LittleEndian.PutUint64(k, testrand.Mix(uint64(i)^salt))
		binary.LittleEndian.PutUint64(k[8:], uint64(i))
		keys[i] = k
	}
	return keys
}

// BenchmarkContains measures lookups in a guard of n keys declared for n
// (grown=false) or grown to n from WithCapacity(1000) (grown=true), whose
// slots keep tails of several lengths.
func BenchmarkContains(b *testing.B) {
	for _, c := range []struct {
		n     int
		grown bool
	}{{1 << 16, false}, {1 << 20, false}, {1 << 20, true}} {
		n := c.n
		capacity := n
		if c.grown {
			capacity = 1000
		}
		g, err := New(WithCapacity(capacity), WithSeed(1))
		if err != nil {
			b.Fatal(err)
		}
		present, absent := benchKeys(n, 1), benchKeys(n, 2)
		for _, k := range present {
			if err := g.Add(k); err != nil {
				b.Fatal(err)
			}
		}
		for _, hit := range []int{0, 100} {
			keys := absent
			if hit == 100 {
				keys = present
			}
			b.Run(fmt.Sprintf("n=%d/grown=%v/hit=%d%%", n, c.grown, hit), func(b *testing.B) {
				b.ReportAllocs()
				found := 0
				i := 0
				for b.Loop() {
					if g.Contains(keys[i&(len(keys)-1)]) {
						found++
					}
					i++
				}
				b.ReportMetric(g.Stats().BitsPerItem, "bits/item")
				b.ReportMetric(float64(g.Stats().MaxDoublings), "doublings")
				if hit == 100 && found != i {
					b.Fatalf("found %d of %d present keys", found, i)
				}
			})
		}
		b.Run(fmt.Sprintf("n=%d/grown=%v/parallel/hit=0%%", n, c.grown), func(b *testing.B) {
			b.ReportAllocs()
			var found atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				f := 0
				for i := 0; pb.Next(); i++ {
					if g.Contains(absent[i&(len(absent)-1)]) {
						f++
					}
				}
				found.Add(int64(f))
			})
		})
		g.Close()
	}
}

func BenchmarkAdd(b *testing.B) {
	keys := benchKeys(1<<20, 3)
	b.ReportAllocs()
	var g *Guard
	i := 0
	for b.Loop() {
		if i&(len(keys)-1) == 0 {
			b.StopTimer()
			var err error
			if g, err = New(WithCapacity(len(keys)), WithSeed(1)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if err := g.Add(keys[i&(len(keys)-1)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
