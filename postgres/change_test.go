package postgres

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseChange(t *testing.T) {
	tests := []struct {
		in   string
		want Change
	}{
		{"I 12 1 9 0: 2:42", Change{Op: Insert, TxID: 12, Seq: 1, At: 9, Key: "42"}},
		{"D 13 2 9 1:A 0:", Change{Op: Delete, TxID: 13, Seq: 2, At: 9, Origin: "A", Key: ""}},
		{"I 14 3 9 3:r 1 5:a b:c", Change{Op: Insert, TxID: 14, Seq: 3, At: 9, Origin: "r 1", Key: "a b:c"}},
		{"U 15 4 9 0: 1:7 2:70", Change{Op: Update, TxID: 15, Seq: 4, At: 9, OldKey: "7", Key: "70"}},
		{"R 16 5 9 0: resync", Change{Op: Resync, TxID: 16, Seq: 5, At: 9}},
		{"I 17 6 9 0: 5:ünï", Change{Op: Insert, TxID: 17, Seq: 6, At: 9, Key: "ünï"}},
		{"S 123-456", Change{Op: Marker, Key: "123-456"}},
	}
	for _, tt := range tests {
		got, err := ParseChange(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseChange(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "I", "I x 1 9 0: 1:a", "I 1 x 9 0: 1:a", "I 1 1 9 0: 2:a", "I 1 1 9 0: 1:ab", "X 1 1 9 0: 1:a",
		"U 1 1 9 0: 1:a", "U 1 1 9 0: 1:a 1:", "R 1 1 9 0: now", "I 1 1 9 0: -1:a", "I 1 1 9 0: a", "I 1 1 9 1:a", "I 1 1 9 5:a 1:a", "I 1 1 t 0: 1:a", "S "} {
		if _, err := ParseChange(bad); !errors.Is(err, ErrPayload) {
			t.Errorf("ParseChange(%q) = %v, want ErrPayload", bad, err)
		}
	}
}

func FuzzParseChange(f *testing.F) {
	f.Add("U 15 4 9 0: 1:7 2:70")
	f.Add("I 12 1 9 1:A 2:42")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseChange(s)
		if err != nil {
			return
		}
		if c.Op != Insert && c.Op != Delete && c.Op != Update && c.Op != Resync && c.Op != Marker {
			t.Fatalf("accepted operation %q", c.Op)
		}
		if !strings.Contains(s, c.Key) || !strings.Contains(s, c.OldKey) {
			t.Fatalf("keys %q, %q not in %q", c.Key, c.OldKey, s)
		}
	})
}

func TestSnapshotVisible(t *testing.T) {
	sn, err := ParseSnapshot("100:110:105,103")
	if err != nil {
		t.Fatal(err)
	}
	for txid, want := range map[uint64]bool{99: true, 100: true, 103: false, 104: true, 105: false, 109: true, 110: false, 200: false} {
		if got := sn.Visible(txid); got != want {
			t.Errorf("Visible(%d) = %v, want %v", txid, got, want)
		}
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "5:2:", "1:9:x"} {
		if _, err := ParseSnapshot(bad); err == nil {
			t.Errorf("ParseSnapshot(%q) accepted", bad)
		}
	}
	if _, err := ParseSnapshot("7:7:"); err != nil {
		t.Errorf("ParseSnapshot(7:7:) = %v", err)
	}
}

func TestChannel(t *testing.T) {
	if Channel("users") != "cuckooguard_users" {
		t.Errorf("Channel(users) = %q", Channel("users"))
	}
	long := strings.Repeat("t", 80)
	if c := Channel(long); len(c) > 63 || c != Channel(long) || c == Channel(long+"x") {
		t.Errorf("Channel of a long name = %q", c)
	}
}

// TestSnapshotVisibleXid: a 32-bit transaction id is placed next to the
// snapshot's xmax, also across the 2^32 wrap of its epoch.
func TestSnapshotVisibleXid(t *testing.T) {
	for _, tc := range []struct {
		sn   Snapshot
		xid  uint32
		want bool
	}{
		{Snapshot{Xmin: 100, Xmax: 110, Xip: []uint64{105}}, 99, true},
		{Snapshot{Xmin: 100, Xmax: 110, Xip: []uint64{105}}, 105, false},
		{Snapshot{Xmin: 100, Xmax: 110, Xip: []uint64{105}}, 110, false},
		{Snapshot{Xmin: 1<<32 - 10, Xmax: 1<<32 - 5}, 3, false},       // the next epoch's 3: after the snapshot
		{Snapshot{Xmin: 1<<32 + 2, Xmax: 1<<32 + 5}, 1<<32 - 7, true}, // the last epoch's: before it
		{Snapshot{Xmin: 1<<32 + 2, Xmax: 1<<32 + 5}, 4, true},         // 2^32+4 committed
		{Snapshot{Xmin: 1<<32 + 2, Xmax: 1<<32 + 5, Xip: []uint64{1<<32 + 4}}, 4, false},
	} {
		if got := tc.sn.VisibleXid(tc.xid); got != tc.want {
			t.Errorf("%+v.VisibleXid(%d) = %v, want %v", tc.sn, tc.xid, got, tc.want)
		}
	}
}
