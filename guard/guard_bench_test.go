package guard

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
)

// benchKeys returns n 16-byte keys, n a power of two.
func benchKeys(n int, salt uint64) [][]byte {
	keys := make([][]byte, n)
	buf := make([]byte, 16*n)
	for i := range keys {
		k := buf[16*i : 16*i+16 : 16*i+16]
		binary.LittleEndian.PutUint64(k, mix(uint64(i)^salt))
		binary.LittleEndian.PutUint64(k[8:], uint64(i))
		keys[i] = k
	}
	return keys
}

func BenchmarkContains(b *testing.B) {
	for _, n := range []int{1 << 16, 1 << 20} {
		g, err := New(WithCapacity(n), WithSeed(1))
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
			b.Run(fmt.Sprintf("n=%d/hit=%d%%", n, hit), func(b *testing.B) {
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
				if hit == 100 && found != i {
					b.Fatalf("found %d of %d present keys", found, i)
				}
			})
		}
		b.Run(fmt.Sprintf("n=%d/parallel/hit=0%%", n), func(b *testing.B) {
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
