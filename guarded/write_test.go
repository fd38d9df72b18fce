package guarded

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cuckooguard/cuckooguard/guard"
)

// TestLoaderInsertGenerated: rows whose keys the store generates, several
// in one write. A key is in the guard from add on, before the write
// commits; a write that proves it wrote nothing takes its keys back, one
// whose outcome is unknown keeps them; add after the write returned is
// refused.
func TestLoaderInsertGenerated(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	l := newTestLoader(t, s, []guard.Option{guard.WithCapacity(1000)})
	l.MarkReady()
	var next atomic.Int64
	next.Store(100)
	// generate is a store's INSERT … RETURNING id of n rows; it checks
	// that each key reads present from its add on, before the commit.
	generate := func(n int, fail error) func(context.Context, func(int) error) error {
		return func(ctx context.Context, add func(int) error) error {
			var ids []int
			for range n {
				id := int(next.Add(1))
				if err := add(id); err != nil {
					return err
				}
				if !l.MayContain(id) {
					t.Errorf("key %d reads absent after add, before the commit", id)
				}
				ids = append(ids, id)
			}
			if fail != nil {
				return fail
			}
			for _, id := range ids {
				s.put(id, "generated")
			}
			return nil
		}
	}
	if err := l.InsertGenerated(ctx, generate(3, nil)); err != nil {
		t.Fatal(err)
	}
	for id := 101; id <= 103; id++ {
		if _, err := l.Get(ctx, id); err != nil {
			t.Fatalf("Get(%d) = %v", id, err)
		}
	}
	refused := errors.New("unique violation")
	err := l.InsertGenerated(ctx, generate(2, errors.Join(refused, ErrNotWritten)))
	if !errors.Is(err, refused) {
		t.Fatalf("InsertGenerated = %v, want the write's error", err)
	}
	if l.Guard().ContainsHash(l.Hash(104)) || l.Guard().ContainsHash(l.Hash(105)) {
		t.Fatal("keys of a write that proved it wrote nothing stayed in the guard")
	}
	if err := l.InsertGenerated(ctx, generate(1, context.DeadlineExceeded)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("InsertGenerated = %v", err)
	}
	if !l.MayContain(106) {
		t.Fatal("the key of a write whose outcome is unknown was taken back")
	}
	if n := l.Guard().Len(); n != 4 {
		t.Fatalf("%d copies, want 4 (101–103, 106)", n)
	}
	var late func(int) error
	if err := l.InsertGenerated(ctx, func(ctx context.Context, add func(int) error) error {
		late = add
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := late(500); err == nil || !strings.Contains(err.Error(), "after write returned") {
		t.Fatalf("add after the write returned = %v, want a refusal", err)
	}
	if err := l.InsertGenerated(ctx, nil); err == nil {
		t.Fatal("InsertGenerated(nil write) = nil")
	}
}
