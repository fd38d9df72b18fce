package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
)

// sourceRecorder is a follow.Handler that keeps what it is given.
type sourceRecorder struct {
	mu      sync.Mutex
	starts  []follow.Start
	commits []follow.Commit
}

func (r *sourceRecorder) Start(_ context.Context, s follow.Start) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, s)
	return nil
}

func (r *sourceRecorder) Commit(_ context.Context, c *follow.Commit) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cp := *c
	cp.Tables = nil
	for _, t := range c.Tables {
		cp.Tables = append(cp.Tables, follow.Changes{Creates: slices.Clone(t.Creates), Deletes: slices.Clone(t.Deletes), Truncated: t.Truncated, Incomplete: t.Incomplete})
	}
	cp.Tags = slices.Clone(c.Tags)
	cp.Controls = slices.Clone(c.Controls)
	r.commits = append(r.commits, cp)
	return nil
}

// wait waits until the recorder holds n commits and returns them.
func (r *sourceRecorder) wait(t *testing.T, n int) []follow.Commit {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.mu.Lock()
		got := slices.Clone(r.commits)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d commits after 30 s, want %d: %+v", len(got), n, got)
		}
	}
}

// runSource runs a Source of users and orders named name until the test
// ends or stop is called.
func runSource(t *testing.T, dsn, name string, r *sourceRecorder) (*source, func()) {
	t.Helper()
	s, err := newSource(dsn, name, []follow.Table{{Table: "users", Key: "id"}, {Table: "orders", Key: "id"}}, WithHeartbeat(hb), WithBackoff(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, r) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	for deadline := time.Now().Add(30 * time.Second); !s.Stats().Streaming; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the source never streamed: %+v", s.Stats())
		}
	}
	return s, stop
}

// TestSource streams two tables through one slot: their changes, a
// transaction touching both, tags, and a relayed follower's heartbeat,
// in commit order; a restart resumes from what the handler confirmed and
// streams the rest again; a lost slot is a reset; and a publication
// changed under it ends the session, and the next starts with the new
// version.
func TestSource(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 10)
	execAll(t, dsn, `CREATE TABLE orders (id bigint PRIMARY KEY, name text)`)
	c := connect(t, dsn)
	if err := Publish(ctx, c, "orders", "id"); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := c.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	name := "src_" + schema
	t.Cleanup(func() { dropSlot(context.Background(), connect(t, dsn), relaySlotName(name)) })
	r := &sourceRecorder{}
	s, stop := runSource(t, dsn, name, r)
	if len(r.starts) != 1 || !r.starts[0].Reset || r.starts[0].Tables[0] != schema+".users" || len(r.starts[0].Versions) != 2 {
		t.Fatalf("first start %+v: want a reset (a new slot) of both tables", r.starts)
	}
	execAll(t, dsn,
		`INSERT INTO users VALUES (100, 'a')`,
		`BEGIN; INSERT INTO orders VALUES (1, 'x'); DELETE FROM users WHERE id = 1; SELECT pg_logical_emit_message(true, 'cuckooguard.origin', 'tag'); COMMIT`,
		fmt.Sprintf(`SELECT pg_logical_emit_message(true, %s, 'H tok-1 v')`, quoteLiteral(controlPrefixOf(schema+".users"))),
		`CREATE TABLE plain (id int)`, `INSERT INTO plain VALUES (1)`, // nothing of the tables
	)
	got := r.wait(t, 3)
	if c0, c1, c2 := got[0], got[1], got[2]; strings.Join(c0.Tables[0].Creates, ",") != "100" || c0.Tables[1].Touched() ||
		strings.Join(c1.Tables[0].Deletes, ",") != "1" || strings.Join(c1.Tables[1].Creates, ",") != "1" || string(c1.Tags[0]) != "tag" ||
		len(c2.Controls) != 1 || c2.Controls[0] != (follow.Control{Route: schema + ".users", Payload: "H tok-1 v"}) ||
		!(c0.Pos < c1.Pos && c1.Pos < c2.Pos) {
		t.Fatalf("commits %+v", got[:3])
	}
	// The handler confirms the first commit only: a restart streams the
	// other two again, from the slot.
	s.Confirm(got[0].Pos)
	time.Sleep(4 * hb) // a status goes out
	stop()
	r2 := &sourceRecorder{}
	_, stop = runSource(t, dsn, name, r2)
	again := r2.wait(t, 2)
	if r2.starts[0].Reset || r2.starts[0].Pos != got[0].Pos || again[0].Pos != got[1].Pos || again[1].Pos != got[2].Pos {
		t.Fatalf("restart: start %+v, commits at %d, %d; want no reset, from %d, then %d and %d",
			r2.starts[0], again[0].Pos, again[1].Pos, got[0].Pos, got[1].Pos, got[2].Pos)
	}
	stop()
	// A slot that is gone: a reset, from a new one. (The server ends the
	// stopped stream's walsender soon after its connection closed, not at
	// once: the slot stays active until then.)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := dropSlot(ctx, c, relaySlotName(name))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	r3 := &sourceRecorder{}
	runSource(t, dsn, name, r3) // stopped at the end of the test
	if !r3.starts[0].Reset || r3.starts[0].Pos <= got[2].Pos {
		t.Fatalf("after the slot was dropped: %+v, want a reset past %d", r3.starts[0], got[2].Pos)
	}
	// A publication changed under the stream: the session ends, and the
	// next one starts with the new version (a relay resets that table).
	before := r3.starts[0].Versions
	execAll(t, dsn, `ALTER PUBLICATION `+publication(t, dsn)+` SET (publish = 'insert, update, delete, truncate')`)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r3.mu.Lock()
		n := len(r3.starts)
		r3.mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the session did not end after the publication changed")
		}
	}
	if after := r3.starts[1].Versions; after[0] == before[0] || after[1] != before[1] || r3.starts[1].Reset {
		t.Fatalf("versions %v, then %v: want users' changed and orders' not, without a reset of the slot", before, after)
	}
}
