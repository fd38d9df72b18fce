package fanout

import (
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
)

// TestMarkerLost: a session's heartbeat that comes back while its marker,
// sent before it, has not says the marker is in no stream (the relay
// started again past it); a heartbeat of another session says nothing.
func TestMarkerLost(t *testing.T) {
	f := &Follower[int64]{}
	f.state.Store(int32(follow.Resyncing))
	s := &fsession[int64]{f: f, token: "t1", out: []outBeat{{seq: 1, sent: time.Now()}, {seq: 2, sent: time.Now()}}}
	if s.control("H t0-1", time.Now()) {
		t.Fatal("another session's heartbeat: marker lost")
	}
	if !s.control("H t1-1", time.Now()) {
		t.Fatal("the session's heartbeat came back before its marker: marker not lost")
	}
}
