package postgres

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/middleware"
)

// BenchmarkKeyPath measures a lookup of a uuid, bigint and text key as an
// application makes one: the key function of the request's text (the
// follower's Key, keypath_key_test.go), then the middleware's MayContain
// and the handler's Loader.Get, or Loader.Get alone, for a key the guard
// holds and one it does not. The store is an in-memory map: ns/op is the
// path's own cost. It compiles against the code before issue 40 too, with
// that code's key functions (the application's own parse), so that the
// two binaries can be compared with benchstat: put this file and
// testdata/keypath/key_old_test.go.txt (as a _test.go file) in a copy of
// the old tree's postgres/, build both with go test -c, and alternate
// them (testdata/keypath/run.sh).
func BenchmarkKeyPath(b *testing.B) {
	const n = 1 << 16
	uuidOf := func(i int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", i*2654435761%(1<<32), i) }
	benchPath(b, "uuid", benchKeyUUID(b), uuidOf, n)
	benchPath(b, "bigint", benchKeyInt(b), func(i int) string { return strconv.Itoa(i * 7919) }, n)
	benchPath(b, "text", benchKeyText(b), func(i int) string { return "user-" + strconv.Itoa(i) + "@example.com" }, n)
}

// benchPath runs the path for keys of one type: the first n keys of key
// present, and as many absent.
func benchPath[K comparable](b *testing.B, typ string, keyOf func(string) (K, error), key func(int) string, n int) {
	ctx := context.Background()
	rows := make(map[K]string, n)
	g, err := guard.New(guard.WithCapacity(2*n), guard.WithSeed(1))
	if err != nil {
		b.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[K, string](func(_ context.Context, k K) (string, error) {
		if v, ok := rows[k]; ok {
			return v, nil
		}
		return "", guarded.ErrNotFound
	}))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	for i := range n {
		k, err := keyOf(key(i))
		if err != nil {
			b.Fatal(err)
		}
		rows[k] = "row"
		if err := l.Insert(ctx, k, func(context.Context) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
	l.MarkReady()
	for i, want := range []error{nil, guarded.ErrNotFound} {
		k, err := keyOf(key(i * n))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := l.Get(ctx, k); err != want {
			b.Fatalf("Get(%v) = %v, want %v", k, err, want)
		}
	}
	var found int
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := keyOf(r.PathValue("id"))
		if _, err := l.Get(r.Context(), k); err == nil {
			found++
		}
	})
	mw, err := middleware.New(l, middleware.Parse(middleware.PathValue("id"), keyOf))
	if err != nil {
		b.Fatal(err)
	}
	h := mw.Wrap(next)
	benchRequests(b, typ, "", l, h, keyOf, key, n, &found)
	// Ready on a lease, as under a follower: an answer "absent" reads the
	// clock (guarded.Feed.ReadyUntil).
	feed, err := l.AttachFeed()
	if err != nil {
		b.Fatal(err)
	}
	defer feed.Detach()
	feed.ReadyUntil(time.Now().Add(time.Hour))
	benchRequests(b, typ, "/ready=lease", l, h, keyOf, key, n, &found)
	if found < 0 {
		b.Fatal("unreachable: keeps found alive")
	}
}

// benchRequests runs the middleware's and Get's paths for keys of one
// type, present and absent, under the names typ and suffix give.
func benchRequests[K comparable](b *testing.B, typ, suffix string, l *guarded.Loader[K, string], h http.Handler, keyOf func(string) (K, error), key func(int) string, n int, found *int) {
	ctx := context.Background()
	for _, present := range []bool{true, false} {
		texts := make([]*http.Request, 1024)
		for i := range texts {
			j := i * 61 % n
			if !present {
				j += n
			}
			r, err := http.NewRequestWithContext(ctx, http.MethodGet, "/x", nil)
			if err != nil {
				b.Fatal(err)
			}
			r.SetPathValue("id", key(j))
			texts[i] = r
		}
		w := &nopWriter{h: http.Header{}}
		name := map[bool]string{true: "present", false: "absent"}[present]
		b.Run(fmt.Sprintf("type=%s/key=%s/path=middleware%s", typ, name, suffix), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				h.ServeHTTP(w, texts[i&1023])
				i++
			}
		})
		b.Run(fmt.Sprintf("type=%s/key=%s/path=get%s", typ, name, suffix), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if k, err := keyOf(texts[i&1023].PathValue("id")); err == nil {
					if _, err := l.Get(ctx, k); err == nil {
						*found++
					}
				}
				i++
			}
		})
	}
}

// nopWriter is a ResponseWriter that keeps nothing.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(int)             {}
