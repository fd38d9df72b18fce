package guard

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkLoaderGet measures Get for a present key, an absent key the
// guard rejects, and a false positive looked up again and again, with and
// without the negative cache. The store is an in-memory map, so ns/op is
// the Loader's own cost; store-calls/op shows what would reach a real
// store.
func BenchmarkLoaderGet(b *testing.B) {
	ctx := context.Background()
	for _, neg := range []bool{false, true} {
		var calls atomic.Int64
		rows := map[string]string{}
		lookup := func(ctx context.Context, k string) (string, error) {
			calls.Add(1)
			if v, ok := rows[k]; ok {
				return v, nil
			}
			return "", ErrNotFound
		}
		g, err := New(WithCapacity(100_000), WithSeed(1))
		if err != nil {
			b.Fatal(err)
		}
		opts := []LoaderOption{WithLogger(slog.New(slog.DiscardHandler))}
		if neg {
			opts = append(opts, WithNegativeCache(10_000, time.Minute))
		}
		l, err := NewLoader(g, lookup, opts...)
		if err != nil {
			b.Fatal(err)
		}
		for i := range 100_000 {
			k := strconv.Itoa(i)
			rows[k] = k
			if err := l.Insert(ctx, k, func(context.Context) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
		l.MarkReady()
		fp := ""
		for i := 0; fp == ""; i++ {
			if k := "absent" + strconv.Itoa(i); l.MayContain(k) {
				fp = k
			}
		}
		for _, c := range []struct{ name, key string }{{"present", "42"}, {"absent", "absent-x"}, {"false-positive", fp}} {
			b.Run(fmt.Sprintf("negcache=%v/key=%s", neg, c.name), func(b *testing.B) {
				calls.Store(0)
				b.ReportAllocs()
				for b.Loop() {
					l.Get(ctx, c.key)
				}
				b.ReportMetric(float64(calls.Load())/float64(b.N), "store-calls/op")
			})
		}
		l.Close()
	}
}
