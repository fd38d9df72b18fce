package postgres

import (
	"testing"

	"github.com/cuckooguard/cuckooguard/follow"
)

func TestSplitIdentity(t *testing.T) {
	cases := []struct {
		name, message, payload string
		id                     follow.TableIdentity
	}{
		{"heartbeat", "H 1f-3\t16384 16390.731/16391.731///k1:20.0.", "H 1f-3", follow.TableIdentity{ID: 16384, Version: "16390.731/16391.731///k1:20.0."}},
		{"marker", "S 1f\t16384 -", "S 1f", follow.TableIdentity{ID: 16384}},
		{"no table under the name", "H 1f-4\t- 16390.731////k1:.", "H 1f-4", follow.TableIdentity{Version: "16390.731////k1:."}},
		{"neither", "H 1f-5\t- -", "H 1f-5", follow.TableIdentity{}},
		{"an earlier follower's", "H 1f-6", "H 1f-6", follow.TableIdentity{}},
		{"unreadable", "H 1f-7\tx y", "H 1f-7", follow.TableIdentity{}},
		{"oid zero", "H 1f-8\t0 v", "H 1f-8", follow.TableIdentity{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			payload, id := splitIdentity(c.message)
			if payload != c.payload || id != c.id {
				t.Errorf("splitIdentity(%q) = %q, %+v; want %q, %+v", c.message, payload, id, c.payload, c.id)
			}
			if c.id.IsZero() {
				return
			}
			back, err := follow.ParseTableIdentity(c.id.String())
			if err != nil || back != c.id {
				t.Errorf("follow.ParseTableIdentity(%q) = %+v, %v; want %+v", c.id.String(), back, err, c.id)
			}
		})
	}
}
