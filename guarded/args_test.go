package guarded

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cuckooguard/cuckooguard/guard"
)

// TestNilArguments is part of the first-hour issue: Insert, Delete and
// Fill with a nil function panicked with no hint. Every method that
// returns an error returns one that names its nil argument; GetMany puts
// it in every key's error.
func TestNilArguments(t *testing.T) {
	ctx := context.Background()
	l := newTestLoader(t, getter(newMemStore[int]().lookup), nil)
	var nilCtx context.Context
	tests := []struct {
		name, want string
		call       func() error
	}{
		{"New(nil option)", "option 1 of 1 is nil", func() error {
			g, err := guard.New()
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			_, err = New(g, getter(newMemStore[int]().lookup), nil)
			return err
		}},
		{"Get(nil ctx)", "Get: ctx is nil", func() error { _, err := l.Get(nilCtx, 1); return err }},
		{"GetMany(nil ctx)", "GetMany: ctx is nil", func() error { _, errs := l.GetMany(nilCtx, []int{1, 2}); return errors.Join(errs...) }},
		{"Insert(nil ctx)", "Insert: ctx is nil", func() error { return l.Insert(nilCtx, 1, func(context.Context) error { return nil }) }},
		{"Insert(nil write)", "Insert: write is nil", func() error { return l.Insert(ctx, 1, nil) }},
		{"Delete(nil ctx)", "Delete: ctx is nil", func() error {
			return l.Delete(nilCtx, 1, func(context.Context) (bool, error) { return false, nil })
		}},
		{"Delete(nil write)", "Delete: write is nil", func() error { return l.Delete(ctx, 1, nil) }},
		{"Fill(nil ctx)", "Fill: ctx is nil", func() error { return l.Fill(nilCtx, seqOf([]int{1})) }},
		{"Fill(nil keys)", "Fill: keys is nil", func() error { return l.Fill(ctx, nil) }},
		{"Fill(KeysOf(nil))", "Fill: keys is nil", func() error { return l.Fill(ctx, KeysOf[int](nil)) }},
		{"CatchUp(nil ctx)", "CatchUp: ctx is nil", func() error { return l.CatchUp(nilCtx, seqOf([]Change[int]{})) }},
		{"CatchUp(nil changes)", "CatchUp: changes is nil", func() error { return l.CatchUp(ctx, nil) }},
		{"Feed.Resync(nil ctx)", "Resync: ctx is nil", func() error {
			f, err := l.AttachFeed()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Detach()
			return f.Resync(nilCtx, func(context.Context, func(int) error) error { return nil })
		}},
		{"Feed.Resync(nil fill)", "Resync: fill is nil", func() error {
			f, err := l.AttachFeed()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Detach()
			return f.Resync(ctx, nil)
		}},
		{"Feed.Replace(nil)", "Replace: g is nil", func() error {
			f, err := l.AttachFeed()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Detach()
			return f.Replace(nil)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%s = %v, want an error that says %q", tt.name, err, tt.want)
			}
		})
	}
	if l.Guard().Len() != 0 || l.Ready() {
		t.Fatalf("calls with nil arguments changed the Loader: %d keys, ready %v", l.Guard().Len(), l.Ready())
	}
}

// TestMisuse is part of the first-hour issue: a closed guard was
// accepted, and a second Fill stacked a copy of every key.
func TestMisuse(t *testing.T) {
	ctx := context.Background()
	t.Run("closed guard", func(t *testing.T) {
		g, err := guard.New()
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
		if _, err := New(g, getter(newMemStore[int]().lookup)); err == nil || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("New over a closed guard = %v, want an error that says it is closed", err)
		}
	})
	t.Run("second Fill", func(t *testing.T) {
		l := newTestLoader(t, getter(newMemStore[int]().lookup), nil)
		keys := []int{1, 2, 3}
		if err := l.Fill(ctx, KeysOf(slices.Values(keys))); err != nil {
			t.Fatal(err)
		}
		if err := l.Fill(ctx, KeysOf(slices.Values(keys))); err == nil {
			t.Fatal("a second Fill on a ready Loader succeeded")
		}
		l.Invalidate() // not ready, but filled: still no second pass
		if err := l.Fill(ctx, KeysOf(slices.Values(keys))); err == nil {
			t.Fatal("a second Fill after Invalidate succeeded")
		}
		if n := l.Guard().Len(); n != len(keys) {
			t.Fatalf("guard holds %d copies of %d keys after refused second Fills", n, len(keys))
		}
	})
	t.Run("Fill after a failed Fill", func(t *testing.T) {
		l := newTestLoader(t, getter(newMemStore[int]().lookup), nil)
		boom := errors.New("boom")
		if err := l.Fill(ctx, func(yield func(int, error) bool) { yield(0, boom) }); !errors.Is(err, boom) {
			t.Fatalf("Fill = %v, want boom", err)
		}
		m := map[int]string{4: "four", 5: "five"}
		if err := l.Fill(ctx, KeysOf(maps.Keys(m))); err != nil || !l.Ready() {
			t.Fatalf("Fill after a failed one = %v (ready %v), want it to run", err, l.Ready())
		}
	})
}
