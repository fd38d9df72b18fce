package guarded

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/cuckooguard/cuckooguard/guard"
)

// TestDegradedGuardSavedAndRestored is the third case of issue 44: a
// guard at its memory cap refused keys (ErrFull), which only the Loader's
// pass-through marks covered. Saved with WriteTo, restored under
// guard.Like and caught up with no changes, its Loader must find every
// committed row. (WriteTo lost the marks: 51 of 2,094 rows read
// ErrNotFound in the issue.)
func TestDegradedGuardSavedAndRestored(t *testing.T) {
	ctx := context.Background()
	s := newMemStore[int]()
	gopts := []guard.Option{guard.WithCapacity(500), guard.WithShards(4), guard.WithSeed(44)}
	twin, err := guard.New(gopts...)
	if err != nil {
		t.Fatal(err)
	}
	// Half again what the guard needs: room to double once or twice, and
	// what Restore accepted before the cap counted the stashes.
	limit := twin.Stats().Bytes * 3 / 2
	twin.Close()
	l := newTestLoader(t, s, append(gopts, guard.WithMaxBytes(limit))) // no key source: no rebuild
	l.MarkReady()
	for i := range 3000 {
		if err := l.Insert(ctx, i, func(context.Context) error { s.put(i, "r"); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	st := l.Stats()
	if st.PassThroughShards == 0 {
		t.Fatalf("no shard refused a key; the test needs a degraded guard: %+v", st)
	}
	var snap bytes.Buffer
	if _, err := l.Guard().WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	rg, err := guard.Restore(&snap, guard.Like(l.Guard()))
	if err != nil {
		t.Fatal(err)
	}
	rl, err := New(rg, getter(s.lookup), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		rg.Close()
		t.Fatal(err)
	}
	defer rl.Close()
	if err := rl.CatchUp(ctx, seqOf[Change[int]](nil)); err != nil {
		t.Fatal(err)
	}
	wrong := 0
	for i := range 3000 {
		if _, err := rl.Get(ctx, i); errors.Is(err, ErrNotFound) {
			wrong++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d of 3000 committed rows read ErrNotFound after the restore; %d of %d shards passed through before it, %d after",
		wrong, st.PassThroughShards, l.Guard().Shards(), rl.Stats().PassThroughShards)
	if wrong > 0 {
		t.Errorf("%d committed rows read ErrNotFound", wrong)
	}
}
