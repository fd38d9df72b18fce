package guarded

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/cuckooguard/cuckooguard/guard"
)

// batchStore wraps a memStore with a counted batch lookup.
type batchStore struct {
	*memStore[int]
	batches atomic.Int64
	asked   atomic.Int64 // keys asked in batches
	fail    error
}

func (s *batchStore) lookupMany(ctx context.Context, keys []int) (map[int]string, error) {
	s.batches.Add(1)
	s.asked.Add(int64(len(keys)))
	if s.fail != nil {
		return nil, s.fail
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	found := make(map[int]string, len(keys))
	for _, k := range keys {
		if v, ok := s.rows[k]; ok {
			found[k] = v
		}
	}
	return found, nil
}

// wrongBatch is a store whose GetMany takes string keys, for a Loader of
// int keys.
type wrongBatch struct{}

func (wrongBatch) Get(context.Context, int) (string, error) { return "", nil }
func (wrongBatch) GetMany(context.Context, []string) (map[string]string, error) {
	return nil, nil
}

func TestLoaderGetMany(t *testing.T) {
	ctx := context.Background()
	s := &batchStore{memStore: newMemStore[int]()}
	for i := range 500 {
		s.put(2*i, "row"+strconv.Itoa(2*i)) // even ids exist
	}
	l := newTestLoader(t, Funcs[int, string]{Lookup: s.lookup, LookupMany: s.lookupMany}, []guard.Option{guard.WithCapacity(1000)})
	if err := l.Fill(ctx, s.keys(ctx)); err != nil {
		t.Fatal(err)
	}
	ids := make([]int, 1000)
	for i := range ids {
		ids[i] = i // half of them absent
	}
	ids = append(ids, 4, 5, 4) // repeats
	vals, errs := l.GetMany(ctx, ids)
	for i, id := range ids {
		switch {
		case id%2 == 0 && (errs[i] != nil || vals[i] != "row"+strconv.Itoa(id)):
			t.Fatalf("GetMany: id %d = %q, %v", id, vals[i], errs[i])
		case id%2 == 1 && !errors.Is(errs[i], ErrNotFound):
			t.Fatalf("GetMany: absent id %d = %q, %v", id, vals[i], errs[i])
		}
	}
	st := l.Stats()
	t.Logf("1000 ids, half absent: %d batch calls asking %d keys, %d single calls, %d avoided, %d false positives",
		s.batches.Load(), s.asked.Load(), s.calls.Load(), st.Avoided, st.FalsePositives)
	if s.batches.Load() != 1 || s.calls.Load() != 0 || s.asked.Load() != int64(500+st.FalsePositives) || st.Avoided+st.FalsePositives != 500 {
		t.Fatalf("%d batch calls asking %d keys and %d single calls for 500 present and 500 absent ids (%d false positives)",
			s.batches.Load(), s.asked.Load(), s.calls.Load(), st.FalsePositives)
	}
	if st.LetThrough != 500+st.FalsePositives { // the repeats count once
		t.Fatalf("GetMany let %d distinct keys through, want %d", st.LetThrough, 500+st.FalsePositives)
	}

	t.Run("batch error", func(t *testing.T) {
		boom := errors.New("boom")
		s := &batchStore{memStore: newMemStore[int](), fail: boom}
		l := newTestLoader(t, Funcs[int, string]{Lookup: s.lookup, LookupMany: s.lookupMany}, nil)
		_, errs := l.GetMany(ctx, []int{1, 2, 3})
		for i, err := range errs {
			if !errors.Is(err, boom) {
				t.Fatalf("key %d: %v, want the batch's error", i, err)
			}
		}
	})
	t.Run("no batch lookup", func(t *testing.T) {
		s := newMemStore[int]()
		s.put(1, "one")
		l := newTestLoader(t, s, nil)
		vals, errs := l.GetMany(ctx, []int{1, 2})
		if vals[0] != "one" || errs[0] != nil || !errors.Is(errs[1], ErrNotFound) || s.calls.Load() != 2 {
			t.Fatalf("GetMany without a batch lookup = %q, %v; %d calls", vals, errs, s.calls.Load())
		}
	})
	t.Run("done ctx", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, errs := l.GetMany(cctx, []int{1, 2})
		if !errors.Is(errs[0], context.Canceled) || !errors.Is(errs[1], context.Canceled) {
			t.Fatalf("GetMany with a done ctx = %v", errs)
		}
	})
	t.Run("wrong types", func(t *testing.T) {
		// Funcs does not compile with a batch lookup of the wrong types; a
		// store type whose GetMany has them is refused, not ignored.
		g := mustNew(t)
		if _, err := New[int, string](g, wrongBatch{}); err == nil {
			t.Fatal("New accepted a store whose GetMany has the wrong key type")
		} else {
			t.Log(err)
		}
	})
}

// TestLoaderGetManyJoinsGet checks that GetMany shares the store call of a
// Get in flight for one of its keys, and leads the others in one batch.
func TestLoaderGetManyJoinsGet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		release := make(chan struct{})
		s := &batchStore{memStore: newMemStore[int]()}
		s.put(1, "one")
		s.put(2, "two")
		var single atomic.Int64
		lookup := func(ctx context.Context, k int) (string, error) {
			single.Add(1)
			<-release
			return s.lookup(ctx, k)
		}
		g, err := guard.New()
		if err != nil {
			t.Fatal(err)
		}
		l, err := New(g, Funcs[int, string]{Lookup: lookup, LookupMany: s.lookupMany})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var wg sync.WaitGroup
		wg.Go(func() { // a Get of 1 in flight
			if v, err := l.Get(ctx, 1); v != "one" || err != nil {
				t.Errorf("Get(1) = %q, %v", v, err)
			}
		})
		synctest.Wait()
		wg.Go(func() {
			vals, errs := l.GetMany(ctx, []int{1, 2, 3})
			if vals[0] != "one" || vals[1] != "two" || errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], ErrNotFound) {
				t.Errorf("GetMany = %q, %v", vals, errs)
			}
		})
		synctest.Wait()
		close(release)
		wg.Wait()
		if single.Load() != 1 || s.batches.Load() != 1 || s.asked.Load() != 2 {
			t.Fatalf("%d single calls, %d batches asking %d keys; want 1, 1, 2 (key 1 shared with the Get)", single.Load(), s.batches.Load(), s.asked.Load())
		}
	})
}
