package postgres

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// TestDecide: where a session starts, for each state it may find.
func TestDecide(t *testing.T) {
	valid := &position{valid: true, applied: 100, pubVersion: "v1"}
	ok := slotState{exists: true, confirmed: 90}
	for _, tc := range []struct {
		name      string
		pending   ReadReason
		temporary bool
		file      bool
		pos       *position
		st        slotState
		pub       string
		want      start
	}{
		{"resume", "", false, false, valid, ok, "v1", start{how: resume}},
		{"first start, no file", ReadStart, false, false, &position{}, ok, "v1", start{read, ReadStart}},
		{"first start, with a file", ReadStart, false, true, &position{}, ok, "v1", start{how: restore}},
		{"no origin", "", true, false, valid, slotState{}, "v1", start{read, ReadNoResume}},
		{"no origin, first", ReadStart, true, false, &position{}, slotState{}, "v1", start{read, ReadStart}},
		{"a read pending", ReadTruncated, false, true, valid, ok, "v1", start{read, ReadTruncated}},
		{"no valid position", "", false, false, &position{applied: 100}, ok, "v1", start{read, ReadResumeFailed}},
		{"slot gone", "", false, false, valid, slotState{}, "v1", start{read, ReadSlotMissing}},
		{"slot lost its WAL", "", false, false, valid, slotState{exists: true, walStatus: "lost"}, "v1", start{read, ReadSlotLost}},
		{"slot moved past", "", false, false, valid, slotState{exists: true, confirmed: 101}, "v1", start{read, ReadSlotMoved}},
		{"publication changed", "", false, false, valid, ok, "v2", start{read, ReadPublication}},
		{"WAL ends at the position", "", false, false, valid, slotState{exists: true, confirmed: 90, walEnd: 100}, "v1", start{how: resume}},
		{"WAL ends before the position", "", false, false, valid, slotState{exists: true, confirmed: 90, walEnd: 99}, "v1", start{read, ReadRewound}},
		{"restored, no slot", "", false, false, valid, slotState{}, "v1", start{read, ReadSlotMissing}},
	} {
		if got := decide(tc.pending, tc.temporary, tc.file, tc.pos, tc.st, tc.pub); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestPositionConfirmsOnlyWhatSurvives is the rule of position: with a
// snapshot file, confirm the file's position, never one of an earlier
// slot instance; without a file of this instance, the position applied.
func TestPositionConfirmsOnlyWhatSurvives(t *testing.T) {
	old := slotID{system: "7", database: "app", name: "cg_1_a", created: 0x1000}
	var p position
	// Restored from the file of the slot at 0x2000, and applied since.
	p.started(old, 0x2000, 0x2000, "v1", time.Now())
	p.advance(0x2500)
	if got := p.confirmable(true); got != 0x2000 {
		t.Fatalf("with a file at 0/2000: confirmable %s, want the file's", got)
	}
	if got := p.confirmable(false); got != 0x2500 {
		t.Fatalf("without a file: confirmable %s, want the position applied", got)
	}
	// A full read makes the slot again at 0x3000; the old file is gone.
	niu := old
	niu.created = 0x3000
	p.started(niu, 0x3000, 0, "v1", time.Time{})
	if got := p.confirmable(true); got < niu.created {
		t.Fatalf("after a full read into a new slot: confirmable %s, below the slot's start %s", got, niu.created)
	}
	if !p.needsSave(time.Now(), time.Hour) {
		t.Fatal("no save wanted after a full read: the new slot has no file")
	}
	p.durable = 0x3000
	p.saved = time.Now()
	p.advance(0x3100)
	if p.needsSave(time.Now(), time.Hour) {
		t.Fatal("a save wanted within the interval")
	}
	if got := p.confirmable(true); got != 0x3000 {
		t.Fatalf("confirmable %s, want the new file's 0/3000", got)
	}
	var zero position
	if got := zero.confirmable(true); got != pglogrepl.LSN(0) {
		t.Fatalf("nothing known: confirmable %s", got)
	}
}
