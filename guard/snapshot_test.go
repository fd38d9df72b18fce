package guard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// snapshotOf returns a guard with n keys added (starting small so that it
// has doubled) and its snapshot.
func snapshotOf(t testing.TB, n int, opts ...Option) (*Guard, []byte) {
	t.Helper()
	g := mustNew(t, opts...)
	for i := range n {
		if err := g.AddString(strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	m, err := g.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if m != int64(buf.Len()) {
		t.Fatalf("WriteTo returned %d, wrote %d bytes", m, buf.Len())
	}
	return g, buf.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		n    int
		opts []Option
	}{
		{"empty", 0, nil},
		{"mixed layout", 12_000, []Option{WithCapacity(12_345)}},
		{"uniform after doublings", 50_000, []Option{WithCapacity(1000), WithShards(7)}},
		{"one shard", 3000, []Option{WithShards(1), WithCapacity(100)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, snap := snapshotOf(t, tt.n, append(tt.opts, WithSeed(testrand.Seed(t)))...)
			r, err := Restore(bytes.NewReader(snap))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if r.Len() != g.Len() || r.Seed() != g.Seed() {
				t.Fatalf("restored Len %d seed %d, want %d, %d", r.Len(), r.Seed(), g.Len(), g.Seed())
			}
			for i := range tt.n {
				if !r.ContainsString(strconv.Itoa(i)) {
					t.Fatalf("restored guard: false negative for %d", i)
				}
			}
			// The restored guard answers exactly like the original.
			for i := range 100_000 {
				k := "absent-" + strconv.Itoa(i)
				if r.ContainsString(k) != g.ContainsString(k) {
					t.Fatalf("restored guard answers %q differently", k)
				}
			}
			gs, rs := g.Stats(), r.Stats()
			if gs.Shards != rs.Shards || gs.Slots != rs.Slots || gs.Doublings != rs.Doublings {
				t.Fatalf("restored stats %+v, want %+v", rs, gs)
			}
			// It keeps working: adds, removes, growth.
			for i := tt.n; i < tt.n+5000; i++ {
				if err := r.AddString(strconv.Itoa(i)); err != nil {
					t.Fatal(err)
				}
			}
			if !r.RemoveString(strconv.Itoa(tt.n)) {
				t.Fatalf("RemoveString on the restored guard failed")
			}
			var again bytes.Buffer
			if _, err := r.WriteTo(&again); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRestoreRejectsBadInput(t *testing.T) {
	_, snap := snapshotOf(t, 500, WithCapacity(1000), WithSeed(3))
	// Every truncation is an error, never a panic or a guard.
	for i := range len(snap) {
		g, err := Restore(bytes.NewReader(snap[:i]))
		if err == nil || g != nil {
			t.Fatalf("Restore of the first %d of %d bytes = %v, %v; want an error", i, len(snap), g, err)
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrSnapshot) {
			t.Fatalf("truncated at %d: %v", i, err)
		}
	}
	// Every single-bit flip is an error (checksum or structure).
	for i := range len(snap) {
		bad := bytes.Clone(snap)
		bad[i] ^= 1 << (i % 8)
		if g, err := Restore(bytes.NewReader(bad)); err == nil {
			g.Close()
			t.Fatalf("Restore accepted a flip of bit %d of byte %d", i%8, i)
		}
	}
	tests := []struct {
		name string
		opts []Option
	}{
		{"seed mismatch", []Option{WithSeed(4)}},
		{"shards mismatch", []Option{WithShards(3)}},
		{"invalid option", []Option{WithGrowThreshold(2)}},
		{"cap too small", []Option{WithMaxBytes(100)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if g, err := Restore(bytes.NewReader(snap), tt.opts...); err == nil {
				g.Close()
				t.Fatalf("Restore with %s succeeded", tt.name)
			} else {
				t.Logf("error: %v", err)
			}
		})
	}
	g, err := Restore(bytes.NewReader(snap), WithSeed(3), WithCapacity(5))
	if err != nil {
		t.Fatalf("Restore with matching seed: %v", err)
	}
	g.Close()
	// A version 1 snapshot (the fixed-tail layout) is refused, saying so.
	v1 := bytes.Clone(snap)
	binary.LittleEndian.PutUint16(v1[4:], 1)
	if g, err := Restore(bytes.NewReader(v1)); err == nil || !errors.Is(err, ErrSnapshot) || !strings.Contains(err.Error(), "version 1") {
		if g != nil {
			g.Close()
		}
		t.Fatalf("Restore of a version 1 snapshot = %v", err)
	}
}

// FuzzRestore feeds arbitrary bytes to Restore: it must return an error or
// a guard, never panic, and a guard it returns must survive use.
func FuzzRestore(f *testing.F) {
	for _, n := range []int{0, 10, 300} {
		_, snap := snapshotOf(f, n, WithCapacity(100), WithSeed(uint64(n)))
		f.Add(snap)
	}
	f.Add(degradedSnapshot(f))
	f.Add([]byte("CKGD"))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Restore(bytes.NewReader(data))
		if err != nil {
			if g != nil {
				t.Fatalf("Restore returned a guard and an error")
			}
			return
		}
		defer g.Close()
		// A valid snapshot restores to a usable guard: it keeps every key
		// added now and writes a snapshot that restores again.
		for i := range 100 {
			if err := g.AddString(strconv.Itoa(i)); err != nil && !errors.Is(err, ErrFull) {
				t.Fatal(err)
			} else if err == nil && !g.ContainsString(strconv.Itoa(i)) {
				t.Fatalf("false negative on a restored guard")
			}
		}
		var buf bytes.Buffer
		if _, err := g.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		h, err := Restore(&buf)
		if err != nil {
			t.Fatalf("re-restore: %v", err)
		}
		h.Close()
	})
}

// degradedSnapshot returns the snapshot of a small guard under its
// smallest memory cap, added to until two shards refused keys: its
// snapshot carries the degraded marks.
func degradedSnapshot(t testing.TB) []byte {
	t.Helper()
	opts := []Option{WithCapacity(10), WithShards(3), WithSeed(7)}
	g := mustNew(t, opts...)
	limit := g.Stats().ReservedBytes
	g.Close()
	g = mustNew(t, append(opts, WithMaxBytes(limit))...)
	for i := 0; g.Stats().DegradedShards < 2; i++ {
		g.AddString(strconv.Itoa(i))
	}
	var buf bytes.Buffer
	if _, err := g.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
