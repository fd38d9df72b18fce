package guarded

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
)

// TestKeyRule: a feed's key rule makes every entry of the Loader take a
// key as a caller types it: lookups of any spelling of a stored key find
// it, a spelling the rule cannot judge goes to the store, a write adds
// the key's form (or is refused, unwritten, if the rule cannot judge it),
// and the store's lookup gets the form.
func TestKeyRule(t *testing.T) {
	ctx := context.Background()
	// The store is case-insensitive (citext): its lookup finds a row for
	// any case, as the database would, and records what it was asked.
	s := newMemStore[string]()
	var asked []string
	lookup := func(ctx context.Context, k string) (string, error) {
		asked = append(asked, k)
		return s.lookup(ctx, strings.ToLower(k))
	}
	for _, k := range []string{"alice@example.com", "bob@example.com"} {
		s.put(k, "row")
	}
	l := newTestLoader(t, GetterFunc[string, string](lookup), []guard.Option{guard.WithCapacity(1000)})
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Detach()
	errUnjudged := errors.New("no form for it")
	feed.SetKeyRule(func(k string) (string, error) {
		if strings.Contains(k, "?") {
			return "", errUnjudged
		}
		return strings.ToLower(k), nil
	})
	if err := feed.Resync(ctx, s.readAll); err != nil {
		t.Fatal(err)
	}
	feed.ReadyUntil(time.Now().Add(time.Hour))

	for _, k := range []string{"Alice@Example.com", "ALICE@EXAMPLE.COM", "alice@example.com"} {
		if !l.MayContain(k) {
			t.Errorf("MayContain(%q) = false: a wrong 404 for a stored key in another case", k)
		}
		asked = nil
		if _, err := l.Get(ctx, k); err != nil {
			t.Errorf("Get(%q) = %v, want the row", k, err)
		}
		if len(asked) != 1 || asked[0] != "alice@example.com" {
			t.Errorf("Get(%q) asked the store for %q, want the key's form once", k, asked)
		}
	}
	asked = nil
	if _, err := l.Get(ctx, "Nobody@Example.com"); !errors.Is(err, ErrNotFound) || len(asked) != 0 {
		t.Errorf("Get of an absent key = %v after %d store calls, want ErrNotFound from the guard", err, len(asked))
	}
	// A text the rule cannot judge: the store decides.
	s.put("odd?key", "row")
	asked = nil
	if _, err := l.Get(ctx, "odd?key"); err != nil || len(asked) != 1 || asked[0] != "odd?key" {
		t.Errorf("Get of a key the rule cannot judge = %v, store asked %q; want the store asked as it is", err, asked)
	}
	if !l.MayContain("odd?key") {
		t.Error("MayContain of a key the rule cannot judge = false")
	}
	vals, errs := l.GetMany(ctx, []string{"BOB@example.com", "bob@EXAMPLE.com", "Nobody@Example.com", "odd?key"})
	for i, want := range []error{nil, nil, ErrNotFound, nil} {
		if !errors.Is(errs[i], want) && !(want == nil && errs[i] == nil) {
			t.Errorf("GetMany[%d] = %q, %v; want %v", i, vals[i], errs[i], want)
		}
	}
	// Writes add the form.
	if err := l.Insert(ctx, "Carol@Example.COM", func(ctx context.Context) error { s.put("carol@example.com", "row"); return nil }); err != nil {
		t.Fatal(err)
	}
	if !l.MayContain("carol@example.com") || !l.Guard().ContainsString("carol@example.com") {
		t.Error("Insert did not add the key's form")
	}
	wrote := false
	err = l.Insert(ctx, "dave?", func(ctx context.Context) error { wrote = true; return nil })
	if !errors.Is(err, errUnjudged) || wrote {
		t.Errorf("Insert of a key the rule cannot judge = %v, wrote %v; want the rule's error and no write", err, wrote)
	}
	err = l.InsertGenerated(ctx, func(ctx context.Context, add func(string) error) error { return add("Eve?") })
	if !errors.Is(err, errUnjudged) {
		t.Errorf("InsertGenerated's add of a key the rule cannot judge = %v, want the rule's error", err)
	}
	// Detach removes the rule.
	feed.Detach()
	if _, judged := l.canon("Alice@Example.com"); !judged || l.rule.Load() != nil {
		t.Error("the rule outlived the feed")
	}
}
