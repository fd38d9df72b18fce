package guarded

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
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
		g, err := guard.New(guard.WithCapacity(100_000), guard.WithSeed(1))
		if err != nil {
			b.Fatal(err)
		}
		var opts []Option
		if neg {
			opts = append(opts, WithNegativeCache(10_000, time.Minute))
		}
		l, err := New(g, getter(lookup), opts...)
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
		// A request's context can be cancelled: Get then waits with a
		// select, as it does under net/http.
		cctx, cancel := context.WithCancel(ctx)
		keys := []struct{ name, key string }{{"present", "42"}, {"absent", "absent-x"}, {"false-positive", fp}}
		for _, c := range keys {
			for _, cc := range []struct {
				name string
				ctx  context.Context
			}{{"background", ctx}, {"cancellable", cctx}} {
				b.Run(fmt.Sprintf("negcache=%v/key=%s/ctx=%s", neg, c.name, cc.name), func(b *testing.B) {
					calls.Store(0)
					b.ReportAllocs()
					for b.Loop() {
						l.Get(cc.ctx, c.key)
					}
					b.ReportMetric(float64(calls.Load())/float64(b.N), "store-calls/op")
				})
			}
		}
		// Ready on a lease, as under a follower: an answer "absent" reads
		// the clock (Feed.ReadyUntil).
		feed, err := l.AttachFeed()
		if err != nil {
			b.Fatal(err)
		}
		feed.ReadyUntil(time.Now().Add(time.Hour))
		for _, c := range keys {
			b.Run(fmt.Sprintf("negcache=%v/key=%s/ctx=background/ready=lease", neg, c.name), func(b *testing.B) {
				calls.Store(0)
				b.ReportAllocs()
				for b.Loop() {
					l.Get(ctx, c.key)
				}
				b.ReportMetric(float64(calls.Load())/float64(b.N), "store-calls/op")
			})
		}
		feed.Detach()
		if !neg {
			// The store alone, for the Loader's overhead on present keys.
			b.Run("direct/key=present", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					lookup(cctx, "42")
				}
			})
		}
		cancel()
		l.Close()
	}
}

// BenchmarkLoaderGetToken is the cost of a consistency token: Get under a
// token the feed has reached (no wait), and Get without one in a process
// where tokens are in use (the context is searched for one). Run it on
// its own: once a token is made, every later lookup of the process
// searches its context (BenchmarkLoaderGet measures the process that
// never made one).
func BenchmarkLoaderGetToken(b *testing.B) {
	g, err := guard.New(guard.WithCapacity(100_000), guard.WithSeed(1))
	if err != nil {
		b.Fatal(err)
	}
	l, err := New(g, getter(func(ctx context.Context, k string) (string, error) {
		if k == "42" {
			return k, nil
		}
		return "", ErrNotFound
	}))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	feed, err := l.AttachFeed()
	if err != nil {
		b.Fatal(err)
	}
	defer feed.Detach()
	if err := feed.Resync(context.Background(), func(ctx context.Context, add func(string) error) error {
		for i := range 100_000 {
			if err := add(strconv.Itoa(i)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	at, _ := NewToken("7303918273_5", 1000)
	feed.Reached(at)
	feed.ReadyUntil(time.Now().Add(time.Hour))
	before, _ := NewToken("7303918273_5", 999)
	// A request's context, a few values deep, as under net/http.
	type k int
	req := context.WithValue(context.WithValue(context.WithValue(context.Background(), k(1), 1), k(2), 2), k(3), 3)
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{{"none", req}, {"reached", WithToken(req, before)}} {
		for _, key := range []string{"42", "absent-x"} {
			b.Run(fmt.Sprintf("token=%s/key=%s", c.name, key), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					l.Get(c.ctx, key)
				}
			})
		}
	}
}
