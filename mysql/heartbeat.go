package mysql

import (
	"strconv"
	"strings"
	"time"
)

// A session sends itself a marker ("S <token>") once its stream has
// started and a heartbeat ("H <token>-<seq>") every WithHeartbeat, as the
// new value of its row in the heartbeat table; each comes back in the
// binlog behind every change committed before it was written.

// beat is a heartbeat sent and not back yet.
type beat struct {
	seq  int64
	sent time.Time
}

// newToken returns a session token: unique among sessions and processes.
func newToken() string {
	return strconv.FormatUint(uint64(time.Now().UnixNano()), 36) + "." + strconv.FormatUint(uint64(randomServerID()), 36)
}

// heartbeat is the payload of heartbeat seq.
func (s *session[K]) heartbeat(seq int64) string {
	return "H " + s.token + "-" + strconv.FormatInt(seq, 10)
}

// control handles this session's marker or heartbeat, back at now behind
// every change committed before it was written, and returns its seq (0
// for the marker); ok is false for another session's.
func (s *session[K]) control(payload string, now time.Time) (seq int64, ok bool) {
	f := s.f
	op, rest, _ := strings.Cut(payload, " ")
	switch op {
	case "S":
		if rest != s.token {
			return 0, false
		}
		if State(f.state.Load()) == Resyncing {
			f.rtt.Store(int64(now.Sub(s.markerSent)))
			f.grant(s.markerSent)
			f.state.Store(int32(Following))
			*s.following = now
		}
		return 0, true
	case "H":
		token, seqText, _ := strings.Cut(rest, "-")
		seq, err := strconv.ParseInt(seqText, 10, 64)
		if token != s.token || err != nil || seq <= 0 {
			return 0, false
		}
		for i, b := range s.out {
			if b.seq == seq {
				s.out = s.out[i+1:] // the stream is in commit order: older ones are lost
				f.rtt.Store(int64(now.Sub(b.sent)))
				if State(f.state.Load()) == Following {
					f.grant(b.sent)
				}
				break
			}
		}
		return seq, true
	}
	return 0, false
}
