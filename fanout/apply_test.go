package fanout

import (
	"errors"
	"testing"
)

// TestProven: only this session's own markers and heartbeats are judged,
// and they prove the table only when the identity their transaction saw
// is the relay's.
func TestProven(t *testing.T) {
	const id, other = "16384 16390.731///k1:20.0.", "16400 16390.731///k1:20.0."
	cases := []struct {
		name      string
		c         ctlMsg
		wantTable bool // ends the session for the table
	}{
		{"own heartbeat, same table", ctlMsg{Payload: "H ab-3", Seen: id, Table: id}, false},
		{"own marker, same table", ctlMsg{Payload: "S ab", Seen: id, Table: id}, false},
		{"own heartbeat, another table", ctlMsg{Payload: "H ab-3", Seen: other, Table: id}, true},
		{"own marker, another table", ctlMsg{Payload: "S ab", Seen: other, Table: id}, true},
		{"own heartbeat, a relay that says nothing", ctlMsg{Payload: "H ab-3", Seen: id}, true},
		{"own heartbeat, no identity seen", ctlMsg{Payload: "H ab-3", Table: id}, true},
		{"another session's heartbeat, another table", ctlMsg{Payload: "H cd-3", Seen: other, Table: id}, false},
		{"another session's marker, nothing said", ctlMsg{Payload: "S cd"}, false},
		{"a token that begins like this session's", ctlMsg{Payload: "S abc", Seen: other, Table: id}, false},
	}
	s := &fsession[int64]{f: &Follower[int64]{table: "users"}, token: "ab"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.proven(c.c)
			var f *failure
			if got := errors.As(err, &f) && f.what == failTable; got != c.wantTable {
				t.Errorf("proven(%+v) = %v; want a %q failure: %v", c.c, err, failTable, c.wantTable)
			}
		})
	}
}
