package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
)

// TestDropStaleSlots: a permanent slot whose follower has not been seen
// for a while is dropped; an active one and a recent one are kept.
func TestDropStaleSlots(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 10)
	a := startReplica(t, dsn, "A")
	b := startReplica(t, dsn, "B")
	c := startReplica(t, dsn, "C")
	a.halt()
	c.halt()
	admin := connect(t, dsn)
	schema, rel, err := splitTable(ctx, admin, "users")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`UPDATE %s SET last_seen = now() - interval '2 hours' WHERE slot_name = ANY($1)`, pgx.Identifier{schema, registry}.Sanitize()),
		[]string{slotName(schema, rel, "A"), slotName(schema, rel, "B")}); err != nil {
		t.Fatal(err)
	}
	slots, err := Slots(ctx, admin, "users")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		t.Logf("slot %+v", s)
	}
	if len(slots) != 3 {
		t.Fatalf("%d slots, want 3", len(slots))
	}
	dropped, err := DropStaleSlots(ctx, admin, "users", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// A: stale and stopped; B: stale by the record but streaming; C:
	// stopped a moment ago.
	if want := []string{slotName(schema, rel, "A")}; fmt.Sprint(dropped) != fmt.Sprint(want) {
		t.Fatalf("dropped %v, want %v", dropped, want)
	}
	if slots, _ := Slots(ctx, admin, "users"); len(slots) != 2 {
		t.Fatalf("%d slots left, want 2", len(slots))
	}
	// A comes back: it reads the table, since its slot is gone.
	a.run()
	a.waitFollowing(t)
	if st := a.follower.Stats(); st.FullReads[ReadStart] != 2 {
		t.Fatalf("A after its slot was dropped: %+v", st)
	}
	_ = b
}

// TestLogicalResume is the resume goal of the logical-decoding issue:
// disconnects during steady writes cause no full read and no wrong 404
// (a 404 for a row committed longer than the heartbeat deadline before
// the lookup). Half of them reset the follower's connections, half stall
// them (a dead connection that looks alive) for up to a few seconds.
func TestLogicalResume(t *testing.T) {
	faults, longest := 4, time.Second
	if os.Getenv("CUCKOOGUARD_MEASURE") != "" {
		faults, longest = 10, 5*time.Second
	}
	var p *tcpproxy.Proxy
	r := startFaultRun(t, faultRows(), 200*time.Millisecond, &p)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var resets, stalls []string
	for i := range faults {
		time.Sleep(300 * time.Millisecond) // following, with writes
		if i%2 == 0 {
			reset := time.Now()
			p.CloseConns()
			r.waitReady(false, 10*time.Second)
			resets = append(resets, r.waitReady(true, 60*time.Second).Sub(reset).Round(time.Millisecond).String())
			continue
		}
		stall := time.Duration(rng.Int64N(int64(longest)))
		p.Stall()
		time.Sleep(stall)
		p.Resume()
		p.CloseConns() // the held bytes are of a session that is over
		back := time.Now()
		r.waitReady(false, 10*time.Second) // if the stall was too short to notice, at once
		stalls = append(stalls, fmt.Sprintf("%v after a %v stall", r.waitReady(true, 60*time.Second).Sub(back).Round(time.Millisecond), stall.Round(time.Millisecond)))
	}
	r.report(fmt.Sprintf("%d disconnects", faults))
	st := r.a.follower.Stats()
	t.Logf("following again %v after each reset, and %v once the connection came back", resets, stalls)
	if st.Resyncs != 1 || len(st.FullReads) != 1 {
		t.Fatalf("full reads %v after %d disconnects, want only the first", st.FullReads, faults)
	}
	if r.wrong.Load() != 0 {
		t.Fatalf("%d wrong 404s", r.wrong.Load())
	}
}
