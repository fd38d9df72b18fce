package guarded

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// errBoom is what the panicking stores below panic with.
var errBoom = errors.New("boom")

// getRecover calls get and returns what it panicked with, if it did.
func getRecover(get func() (string, error)) (panicked any) {
	defer func() { panicked = recover() }()
	get()
	return nil
}

// TestGetPanicFreesKey is the sixth defect of the client-found issue: a
// store lookup that panicked left its key's call in flight, and every
// later Get of the key waited for it until its own deadline. The panic
// reaches the Get that ran the lookup, the Gets waiting on it get an error
// that says so, and the next Get of the key calls the store again. The
// same for a lookup that calls runtime.Goexit (a test's t.FailNow, say),
// whose Get never returns.
func TestGetPanicFreesKey(t *testing.T) {
	for _, goexit := range []bool{false, true} {
		name := "panic"
		if goexit {
			name = "goexit"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				release := make(chan struct{})
				var calls atomic.Int64
				lookup := func(ctx context.Context, k string) (string, error) {
					if calls.Add(1) == 1 {
						<-release
						if goexit {
							runtime.Goexit()
						}
						panic(errBoom)
					}
					return "v", nil
				}
				l := newTestLoader(t, getter(lookup), nil)
				// The leader: its Get runs the lookup and panics or exits.
				var leader any
				leaderDone := make(chan struct{})
				go func() {
					defer close(leaderDone)
					leader = getRecover(func() (string, error) { return l.Get(ctx, "k") })
				}()
				synctest.Wait()
				// Three Gets wait on the leader's call.
				waiters := make(chan error, 3)
				for range 3 {
					go func() {
						_, err := l.Get(ctx, "k")
						waiters <- err
					}()
				}
				synctest.Wait()
				close(release)
				<-leaderDone
				for range 3 {
					err := <-waiters
					want := "panicked: boom"
					if goexit {
						want = "runtime.Goexit"
					}
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Fatalf("waiting Get = %v, want an error that says %q", err, want)
					}
					if !goexit && !errors.Is(err, errBoom) {
						t.Fatalf("waiting Get = %v, does not wrap the panic's error", err)
					}
				}
				if goexit {
					if leader != nil {
						t.Fatalf("the leader's Get panicked with %v after a Goexit", leader)
					}
				} else {
					perr, ok := leader.(error)
					if !ok || !errors.Is(perr, errBoom) || !strings.Contains(perr.Error(), "flight_test.go") {
						t.Fatalf("the leader's Get panicked with %v, want the store's panic with its stack", leader)
					}
				}
				// The key is free: the next Get calls the store and gets
				// its answer.
				if v, err := l.Get(ctx, "k"); v != "v" || err != nil {
					t.Fatalf("Get after the panic = %q, %v; want v, nil", v, err)
				}
				if n := calls.Load(); n != 2 {
					t.Fatalf("%d store calls, want 2", n)
				}
			})
		})
	}
}

// TestGetManyPanicFreesKeys: a batch lookup that panics frees every key
// it led, and the panic reaches the GetMany that ran it.
func TestGetManyPanicFreesKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		release := make(chan struct{})
		s := &batchStore{memStore: newMemStore[int]()}
		s.put(1, "one")
		s.put(2, "two")
		var batches atomic.Int64
		many := func(ctx context.Context, keys []int) (map[int]string, error) {
			if batches.Add(1) == 1 {
				<-release
				panic(errBoom)
			}
			return s.lookupMany(ctx, keys)
		}
		l := newTestLoader(t, Funcs[int, string]{Lookup: s.lookup, LookupMany: many}, nil)
		var leader any
		var wg sync.WaitGroup
		wg.Go(func() {
			defer func() { leader = recover() }()
			l.GetMany(ctx, []int{1, 2})
		})
		synctest.Wait()
		waiter := make(chan error, 1)
		go func() {
			_, err := l.Get(ctx, 2)
			waiter <- err
		}()
		synctest.Wait()
		close(release)
		wg.Wait()
		if err, ok := leader.(error); !ok || !errors.Is(err, errBoom) {
			t.Fatalf("the GetMany that ran the batch panicked with %v, want the batch's panic", leader)
		}
		if err := <-waiter; !errors.Is(err, errBoom) {
			t.Fatalf("Get waiting on the batch = %v, want its panic as an error", err)
		}
		vals, errs := l.GetMany(ctx, []int{1, 2})
		if vals[0] != "one" || vals[1] != "two" || errs[0] != nil || errs[1] != nil {
			t.Fatalf("GetMany after the panic = %q, %v", vals, errs)
		}
	})
}

// TestInsertWritePanic: a write that panics has an unknown outcome. The
// key stays in the guard, the key is free for the next Insert, and a
// negative entry cached by a lookup that ran during the write is not
// trusted afterwards.
func TestInsertWritePanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := newMemStore[int]()
		l := newTestLoader(t, getter(s.lookup), nil, WithNegativeCache(100, 1<<40))
		l.MarkReady()
		inWrite := make(chan struct{})
		release := make(chan struct{})
		var leader any
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() { leader = recover() }()
			l.Insert(ctx, 7, func(context.Context) error {
				close(inWrite)
				<-release
				s.put(7, "seven") // the row is written, and then the handler panics
				panic(errBoom)
			})
		}()
		<-inWrite
		// A Get during the write finds 7 in the guard (Insert added it),
		// misses the row in the store and caches "absent".
		if _, err := l.Get(ctx, 7); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get during the write = %v, want ErrNotFound", err)
		}
		close(release)
		<-done
		if err, ok := leader.(error); !ok || !errors.Is(err, errBoom) {
			t.Fatalf("Insert panicked with %v, want the write's panic", leader)
		}
		if v, err := l.Get(ctx, 7); v != "seven" || err != nil {
			t.Fatalf("Get after a write that panicked = %q, %v; want the row", v, err)
		}
		// The key is free for the next Insert of it.
		if err := l.Insert(ctx, 7, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	})
}

// joined reports whether a call of key is in flight with a waiter besides
// its leader.
func (f *flight[K, V]) joined(h uint64, key K) bool {
	st := f.calls.of(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	c, ok := st.m[key]
	return ok && c.waiters > 0
}
