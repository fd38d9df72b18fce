package guarded

import (
	"context"
	"iter"
	"runtime"
	"testing"

	"github.com/cuckooguard/cuckooguard/guard"
)

// TestRebuildDiscardedWhenFeedAttaches is the rebuild of the follower
// issue: a rebuild from the key source that began before a change feed
// attached, and installs its guard after the feed applied changes, would
// drop them (its plain read is not ordered against the stream). The
// rebuild here reads the store as it was before the feed's change, and is
// held until the feed has attached and applied it.
func TestRebuildDiscardedWhenFeedAttaches(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	for i := range 100 {
		s.put(i, "r")
	}
	// The rebuild's read: the store as it was before the feed's change.
	before := s.keys(ctx)
	src := Funcs[int, string]{Lookup: s.lookup, ListKeys: func(context.Context) iter.Seq2[int, error] { return before }}
	l := newTestLoader(t, src, []guard.Option{guard.WithCapacity(1000)})
	if err := l.Fill(ctx, s.keys(ctx)); err != nil {
		t.Fatal(err)
	}
	l.rebuildMu.Lock() // the rebuild waits here, as behind a resync
	l.rebuild()
	if !l.Stats().Rebuilding {
		t.Fatal("no rebuild started")
	}
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	s.put(1000, "created by another process")
	if err := feed.Apply(Change[int]{Key: 1000}); err != nil {
		t.Fatal(err)
	}
	feed.MarkReady()
	l.rebuildMu.Unlock()
	for l.Stats().Rebuilding {
		runtime.Gosched()
	}
	if !l.MayContain(1000) {
		t.Fatalf("the key-source rebuild was installed after the feed attached: key 1000, applied by the feed, reads absent (rebuilds installed: %d)", l.Stats().Rebuilds)
	}
	if st := l.Stats(); st.Rebuilds != 0 || st.RebuildErrors != 0 {
		t.Fatalf("rebuilds %d, errors %d: want the rebuild discarded, neither installed nor counted as failed", st.Rebuilds, st.RebuildErrors)
	}
	feed.Detach()
}

// TestFeedDegraded: a guard whose shard refused a key is degraded until a
// resync builds a fresh one, and a saved copy of it would lose the key
// (the follower issue's first case).
func TestFeedDegraded(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	g, err := guard.New(guard.WithCapacity(1000), guard.WithShards(2))
	if err != nil {
		t.Fatal(err)
	}
	limit := g.Stats().Bytes + 1000
	g.Close()
	l := newTestLoader(t, s, []guard.Option{guard.WithCapacity(1000), guard.WithShards(2), guard.WithMaxBytes(limit)},
		WithRebuildGuard(uncapped))
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Detach()
	feed.MarkReady()
	if feed.Degraded() {
		t.Fatal("an empty guard is degraded")
	}
	refused := -1
	for i := 0; refused < 0 && i < 100_000; i++ {
		s.put(i, "r")
		if err := feed.Apply(Change[int]{Key: i}); err != nil {
			t.Fatal(err)
		}
		if feed.Degraded() {
			refused = i
		}
	}
	if refused < 0 {
		t.Fatal("no shard ever refused a key under the memory cap")
	}
	if feed.Guard().ContainsHash(l.Hash(refused)) {
		t.Skip("the refused key collides with a stored one; try another cap")
	}
	if !l.MayContain(refused) {
		t.Fatalf("key %d, refused by a full shard, reads absent", refused)
	}
	err = feed.Resync(ctx, s.readAll)
	if err != nil {
		t.Fatal(err)
	}
	feed.MarkReady()
	if feed.Degraded() {
		t.Fatalf("degraded after a resync into an uncapped guard: %+v", l.Stats())
	}
}
