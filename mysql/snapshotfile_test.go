package mysql

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/cuckooguard/cuckooguard/guard"
)

// testSnap is the header of the tests' snapshot files.
func testSnap() snapFile {
	return snapFile{
		at: resumePoint{serverID: 7, file: "binlog.000042", start: 1234, end: 1601,
			gtid: gtid{domain: 0, server: 7, seq: 99}, sum: 0xfeedface12345678,
			pos: gtidPos{0: {0, 7, 99}, 3: {3, 9, 12}},
			col: column{schema: "shop", table: "users", name: "id", ordinal: 0, columns: 3, dataType: "bigint", columnType: "bigint(20)",
				engine: "InnoDB", uniqueKey: "PRIMARY"}},
		table: "users", key: "id", held: []string{"5", "17", "5"},
	}
}

func TestSnapshotFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "users.guard")
	g, err := guard.New(guard.WithCapacity(10_000))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := range 5000 {
		if err := g.AddString(strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	h := testSnap()
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
	if !reflect.DeepEqual(got, h) {
		t.Fatalf("header %+v, want %+v", got, h)
	}
	if r.Len() != g.Len() || r.Seed() != g.Seed() {
		t.Fatalf("restored %d keys, seed %d; want %d, %d", r.Len(), r.Seed(), g.Len(), g.Seed())
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

// TestSnapshotFileDamaged: a file cut short, or with any byte changed, is
// refused with errSnapshotFile (the header by its checksum, the guard by
// its own), never read as a guard.
func TestSnapshotFileDamaged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "users.guard")
	g, err := guard.New(guard.WithCapacity(1000))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := range 100 {
		g.AddString(strconv.Itoa(i))
	}
	if _, err := writeSnapshotFile(path, testSnap(), g); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.guard")
	try := func(name string, b []byte) {
		t.Helper()
		if err := os.WriteFile(bad, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, r, err := readSnapshotFile(bad)
		if r != nil {
			r.Close()
		}
		if !errors.Is(err, errSnapshotFile) {
			t.Fatalf("%s: %v, want errSnapshotFile", name, err)
		}
	}
	for _, n := range []int{0, 3, 20, 60, len(good) / 2, len(good) - 1} {
		try("cut at "+strconv.Itoa(n), good[:n])
	}
	for i := 0; i < len(good); i += max(1, len(good)/500) {
		b := append([]byte(nil), good...)
		b[i] ^= 0x40
		try("byte "+strconv.Itoa(i)+" changed", b)
	}
}
