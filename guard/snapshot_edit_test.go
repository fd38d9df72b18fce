package guard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// resum recomputes a snapshot's checksum after an edit, as anyone who can
// write the file can.
func resum(snap []byte) {
	binary.LittleEndian.PutUint64(snap[len(snap)-8:], xxh3.Hash(snap[:len(snap)-8]))
}

// TestRestoreRefusesImplausibleEdits: edits whose checksum was recomputed
// are refused where a shard's counts or tails show them (issue 44, case
// 5): a shard that claims fewer items than slots without void entries to
// explain it, and a slot whose tail is shorter than the shard's
// doublings allow. Then it measures the rest: random one-byte edits with
// the checksum recomputed, how many Restore accepts and how many of those
// lack a key. Those it cannot refuse: the checksum protects against
// accidents, not a writer who recomputes it (see the format).
func TestRestoreRefusesImplausibleEdits(t *testing.T) {
	const n = 2000
	g, snap := snapshotOf(t, n, WithCapacity(4000), WithShards(4), WithSeed(testrand.Seed(t)))
	if g.Stats().Doublings != 0 {
		t.Fatalf("the test needs shards that have not doubled: %+v", g.Stats())
	}
	const shard0 = 24 // header, equal shards: no bounds, no degraded marks
	t.Run("fewer items than slots", func(t *testing.T) {
		bad := bytes.Clone(snap)
		items := binary.LittleEndian.Uint64(bad[shard0+8:])
		binary.LittleEndian.PutUint64(bad[shard0+8:], items-1)
		resum(bad)
		if r, err := Restore(bytes.NewReader(bad)); err == nil {
			r.Close()
			t.Fatal("Restore accepted a shard of more slots than items and no void entry")
		} else if !errors.Is(err, ErrSnapshot) {
			t.Fatalf("Restore = %v, want ErrSnapshot", err)
		}
	})
	t.Run("short tail without doublings", func(t *testing.T) {
		bad := bytes.Clone(snap)
		stash := int(binary.LittleEndian.Uint16(bad[shard0+2:]))
		// The first occupied slot of the first shard's buckets: its low
		// byte holds the tail and the marker after it; 0x80 is a tail of
		// no bits, which no entry of an undoubled shard has.
		for i := shard0 + 24 + 8*stash; ; i += 2 {
			if binary.LittleEndian.Uint16(bad[i:]) != 0 {
				bad[i] = 0x80
				break
			}
		}
		resum(bad)
		if r, err := Restore(bytes.NewReader(bad)); err == nil {
			r.Close()
			t.Fatal("Restore accepted a tail shorter than the shard's doublings allow")
		} else if !errors.Is(err, ErrSnapshot) {
			t.Fatalf("Restore = %v, want ErrSnapshot", err)
		}
	})
	// Random edits, each one byte changed and the checksum recomputed.
	r := rand.New(rand.NewPCG(testrand.Seed(t), 5))
	edits := 3000
	if testing.Short() {
		edits = 500
	}
	accepted, lacking := 0, 0
	for range edits {
		bad := bytes.Clone(snap)
		i := r.IntN(len(bad) - 8)
		bad[i] ^= byte(r.IntN(255) + 1)
		resum(bad)
		rg, err := Restore(bytes.NewReader(bad))
		if err != nil {
			continue
		}
		accepted++
		for k := range n {
			if !rg.ContainsString(strconv.Itoa(k)) {
				lacking++
				break
			}
		}
		rg.Close()
	}
	t.Logf("%d random one-byte edits with the checksum recomputed: %d accepted, %d of them lacking a key", edits, accepted, lacking)
}

// TestSnapshotKeepsDegradedShards is the third case of issue 44 at the
// guard's level: a guard whose shards refused keys with ErrFull saves
// which, and the restored guard says so (Degraded), so that an owner that
// passes those shards through does again after a restart. A guard without
// degraded shards writes what earlier releases read (flags 0), and
// malformed marks are refused.
func TestSnapshotKeepsDegradedShards(t *testing.T) {
	seed := testrand.Seed(t)
	_, clean := snapshotOf(t, 100, WithCapacity(1000), WithShards(3), WithSeed(seed))
	if f := binary.LittleEndian.Uint16(clean[6:]); f != 0 {
		t.Fatalf("a guard with no degraded shard wrote flags %#x, want 0", f)
	}
	g := mustNew(t, WithCapacity(100), WithShards(3), WithSeed(seed), WithMaxBytes(smallestCap(t, []Option{WithCapacity(100), WithShards(3), WithSeed(seed)})))
	full := 0
	for i := 0; full < 20; i++ {
		if err := g.AddString(strconv.Itoa(i)); errors.Is(err, ErrFull) {
			full++
			if !g.Degraded(g.ShardIndex(g.HashString(strconv.Itoa(i)))) {
				t.Fatal("a shard that refused a key is not marked degraded")
			}
		}
	}
	st := g.Stats()
	if st.DegradedShards == 0 || st.AddFailures == 0 {
		t.Fatalf("Stats after ErrFull: %+v", st)
	}
	var buf bytes.Buffer
	if _, err := g.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	snap := buf.Bytes()
	rg, err := Restore(bytes.NewReader(snap), Like(g))
	if err != nil {
		t.Fatal(err)
	}
	defer rg.Close()
	for i := range g.Shards() {
		if rg.Degraded(i) != g.Degraded(i) {
			t.Fatalf("shard %d: restored Degraded = %v, want %v", i, rg.Degraded(i), g.Degraded(i))
		}
	}
	if got := rg.Stats().DegradedShards; got != st.DegradedShards {
		t.Fatalf("restored DegradedShards = %d, want %d", got, st.DegradedShards)
	}
	const marks = 24 // after the header: equal shards, no bounds
	for _, tt := range []struct {
		name string
		edit func(b []byte)
	}{
		{"unknown flag", func(b []byte) { b[6] |= 2 }},
		{"flag without marks", func(b []byte) { binary.LittleEndian.PutUint64(b[marks:], 0) }},
		{"mark past the last shard", func(b []byte) { b[marks] |= 1 << 3 }},
	} {
		bad := bytes.Clone(snap)
		tt.edit(bad)
		resum(bad)
		if r, err := Restore(bytes.NewReader(bad)); err == nil {
			r.Close()
			t.Errorf("%s: Restore accepted it", tt.name)
		} else if !errors.Is(err, ErrSnapshot) {
			t.Errorf("%s: Restore = %v, want ErrSnapshot", tt.name, err)
		}
	}
}

// TestRestoreAcceptsGrownSnapshots: Restore's plausibility checks must
// accept every genuine snapshot: of guards that doubled many times,
// whose entries lost their tails and were copied into both halves, with
// removes in between.
func TestRestoreAcceptsGrownSnapshots(t *testing.T) {
	r := rand.New(rand.NewPCG(testrand.Seed(t), 6))
	rounds := 6
	if testing.Short() {
		rounds = 2
	}
	for round := range rounds {
		g := mustNew(t, WithCapacity(1), WithShards(1+round%3), WithSeed(r.Uint64()))
		var added []uint64
		for step := range 40_000 {
			if len(added) > 0 && r.IntN(3) == 0 {
				i := r.IntN(len(added))
				g.RemoveHash(added[i])
				added[i] = added[len(added)-1]
				added = added[:len(added)-1]
			} else if h := r.Uint64(); g.AddHash(h) == nil {
				added = append(added, h)
			}
			if step%5000 == 4999 {
				var buf bytes.Buffer
				if _, err := g.WriteTo(&buf); err != nil {
					t.Fatal(err)
				}
				rg, err := Restore(&buf)
				if err != nil {
					t.Fatalf("round %d step %d (%d doublings, %d void): Restore of a genuine snapshot: %v", round, step, g.Stats().Doublings, g.Stats().VoidCopies, err)
				}
				rg.Close()
			}
		}
		if st := g.Stats(); st.MaxDoublings < 8 {
			t.Fatalf("round %d: %d doublings at most; the test needs void entries", round, st.MaxDoublings)
		}
	}
}
