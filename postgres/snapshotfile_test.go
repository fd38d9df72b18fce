package postgres

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/jackc/pglogrepl"
)

// testSlot is the slot instance of the tests' snapshot files.
var testSlot = slotID{system: "7212345678901234567", database: "app", name: "cg_1_a", created: 0x1_0000_0000}

// snapshotBytes returns the bytes of a snapshot file of a guard holding
// keys 0..n-1 (as strings), at lsn.
func snapshotBytes(t testing.TB, n int, lsn uint64) []byte {
	t.Helper()
	g, err := guard.New(guard.WithCapacity(max(n, 16)), guard.WithSeed(3))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := range n {
		g.AddString(strconv.Itoa(i))
	}
	path := filepath.Join(t.TempDir(), "s.guard")
	if _, err := writeSnapshotFile(path, snapFile{lsn: pglogrepl.LSN(lsn), slot: testSlot, table: "app.users", key: "id", pubVersion: "1.2/3.4//"}, g); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSnapshotFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "users.guard")
	g, err := guard.New(guard.WithCapacity(10_000), guard.WithMaxBytes(1<<20), guard.WithGrowThreshold(0.8))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := range 5000 {
		if err := g.AddString(strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	h := snapFile{lsn: 0x1_2345_6789, slot: testSlot, table: "app.users", key: "id", pubVersion: "1.2/3.4//"}
	for range 2 { // the second write replaces the first
		if _, err := writeSnapshotFile(path, h, g); err != nil {
			t.Fatal(err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("%d files in the directory after two writes, want the snapshot alone: %v", len(entries), entries)
	}
	got, r, err := readSnapshotFile(path, guard.Like(g))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got != h {
		t.Fatalf("header %+v, want %+v", got, h)
	}
	if r.Len() != g.Len() || r.Seed() != g.Seed() || r.Stats().MaxBytes != g.Stats().MaxBytes {
		t.Fatalf("restored %d keys, seed %d, cap %d; want %d, %d, %d", r.Len(), r.Seed(), r.Stats().MaxBytes, g.Len(), g.Seed(), g.Stats().MaxBytes)
	}
	for i := range 5000 {
		if !r.ContainsString(strconv.Itoa(i)) {
			t.Fatalf("key %d missing after the round trip", i)
		}
	}
	if _, _, err := readSnapshotFile(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v, want os.ErrNotExist", err)
	}
}

// TestSnapshotFileRejects: a file cut short anywhere, or with any byte of
// its header changed, is refused, with no guard.
func TestSnapshotFileRejects(t *testing.T) {
	good := snapshotBytes(t, 1000, 7)
	path := filepath.Join(t.TempDir(), "s.guard")
	check := func(name string, b []byte) {
		t.Helper()
		os.WriteFile(path, b, 0o644)
		h, g, err := readSnapshotFile(path)
		if err == nil || g != nil {
			t.Fatalf("%s: read %+v with no error", name, h)
		}
		if !errors.Is(err, errSnapshotFile) {
			t.Fatalf("%s: %v, want an error of the snapshot file", name, err)
		}
	}
	for n := 0; n < len(good); n += max(1, len(good)/200) {
		check("cut at "+strconv.Itoa(n), good[:n])
	}
	hdr := len(snapFile{slot: testSlot, table: "app.users", key: "id", pubVersion: "1.2/3.4//"}.marshal())
	for i := range hdr {
		b := append([]byte(nil), good...)
		b[i] ^= 0x55
		check("header byte "+strconv.Itoa(i), b)
	}
	b := append([]byte(nil), good...)
	b[len(b)-1] ^= 1 // the guard's checksum
	check("guard checksum", b)
}

// FuzzSnapshotFile: whatever the file holds, reading it returns an error
// or a guard, never a panic.
func FuzzSnapshotFile(f *testing.F) {
	good := snapshotBytes(f, 100, 1)
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	f.Add([]byte("CGFS"))
	path := filepath.Join(f.TempDir(), "s.guard")
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, g, err := readSnapshotFile(path)
		if err == nil {
			if g == nil {
				t.Fatal("no error and no guard")
			}
			g.Close()
		}
	})
}
