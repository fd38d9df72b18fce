package guarded

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
)

// TestFeedLease: a Loader whose feed holds a lease answers "absent" on the
// guard alone while the lease holds, and passes every lookup through once
// it has run out, whether or not the feed's goroutine ran since (a
// process paused while a row was created elsewhere: the row's change has
// not been applied). Each answer compares the lease with the clock when
// it is given; so do Ready and Stats.
func TestFeedLease(t *testing.T) {
	const maxLag = 150 * time.Millisecond
	ctx := context.Background()
	lookups := []struct {
		name string
		get  func(l *Loader[int, string], key int) (string, error)
	}{
		{"Get", func(l *Loader[int, string], key int) (string, error) { return l.Get(ctx, key) }},
		{"GetMany", func(l *Loader[int, string], key int) (string, error) {
			vals, errs := l.GetMany(ctx, []int{key, key + 1_000_000})
			return vals[0], errs[0]
		}},
		{"MayContain", func(l *Loader[int, string], key int) (string, error) {
			if !l.MayContain(key) {
				return "", ErrNotFound
			}
			return l.Get(ctx, key)
		}},
	}
	for _, lk := range lookups {
		t.Run(lk.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newMemStore[int]()
				for i := range 100 {
					s.put(i, "r")
				}
				l := newTestLoader(t, s, []guard.Option{guard.WithCapacity(1000)}, WithNegativeCache(100, time.Hour))
				feed, err := l.AttachFeed()
				if err != nil {
					t.Fatal(err)
				}
				defer feed.Detach()
				if err := feed.Resync(ctx, s.readAll); err != nil {
					t.Fatal(err)
				}
				// A key the guard holds and the store does not: its store
				// "not found" goes into the negative cache, which must not
				// answer for it once the lease has run out either.
				if err := l.Guard().AddHash(l.Hash(5000)); err != nil {
					t.Fatal(err)
				}
				sent := time.Now()
				feed.ReadyUntil(sent.Add(maxLag))
				if !l.Ready() || !l.Stats().Ready {
					t.Fatal("Ready false under a lease that holds")
				}
				if _, err := l.Get(ctx, 5000); !errors.Is(err, ErrNotFound) {
					t.Fatalf("Get(5000) = %v, want ErrNotFound", err)
				}
				calls := l.Stats().StoreCalls
				if _, err := lk.get(l, 424242); !errors.Is(err, ErrNotFound) {
					t.Fatalf("absent key under the lease: got %v, want ErrNotFound", err)
				}
				if _, err := l.Get(ctx, 5000); !errors.Is(err, ErrNotFound) {
					t.Fatalf("Get(5000) = %v, want ErrNotFound", err)
				}
				if got := l.Stats().StoreCalls; got != calls {
					t.Fatalf("store calls %d, want %d: the guard and the negative cache answer under the lease", got, calls)
				}

				// The process "sleeps": the feed applies nothing, rows are
				// created meanwhile, and the lease runs out.
				time.Sleep(maxLag)
				s.put(424242, "created while the feed slept")
				s.put(5000, "created while the feed slept")
				if l.Ready() || l.Stats().Ready {
					t.Fatal("Ready true after the lease ran out")
				}
				for _, k := range []int{424242, 5000} {
					if v, err := lk.get(l, k); err != nil {
						t.Fatalf("key %d, created while the lease ran out: got %q, %v, want its row (a wrong 404)", k, v, err)
					}
				}
				if _, err := lk.get(l, 777_777); !errors.Is(err, ErrNotFound) {
					t.Fatalf("a key nobody created: got %v, want the store's ErrNotFound", err)
				}

				// A heartbeat sent before the pause that comes back after
				// it proves nothing about the pause: its lease is over
				// when it is granted.
				feed.ReadyUntil(sent.Add(maxLag))
				if l.Ready() {
					t.Fatal("Ready true on a lease granted for a heartbeat sent before the pause")
				}
				// One sent after it does.
				if err := feed.Apply(Change[int]{Key: 424242}); err != nil {
					t.Fatal(err)
				}
				if err := feed.Apply(Change[int]{Key: 5000}); err != nil {
					t.Fatal(err)
				}
				feed.ReadyUntil(time.Now().Add(maxLag))
				if !l.Ready() {
					t.Fatal("Ready false on a fresh lease")
				}
				calls = l.Stats().StoreCalls
				if _, err := lk.get(l, 31337); !errors.Is(err, ErrNotFound) {
					t.Fatalf("absent key under the fresh lease: got %v, want ErrNotFound", err)
				}
				if got := l.Stats().StoreCalls; got != calls {
					t.Fatalf("store calls %d, want %d under the fresh lease", got, calls)
				}
				// MarkReady has no end; Invalidate ends either.
				feed.MarkReady()
				time.Sleep(time.Hour)
				if !l.Ready() {
					t.Fatal("Ready false after MarkReady")
				}
				feed.Invalidate()
				if l.Ready() {
					t.Fatal("Ready true after Invalidate")
				}
			})
		})
	}
}
