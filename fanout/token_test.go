package fanout

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// TestReadYourWritesThroughRelay: a client creates a row through replica A
// (or through a client of no replica's) and at once, with no sleep, looks
// it up on replicas B and C under the write's token
// (postgres.WriteToken): each finds every row, in steady state and while
// a standby relay takes over from the one that stops. The same lookups
// on B's guard without the token are counted.
func TestReadYourWritesThroughRelay(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 100)
	_, stop1 := e.startRelay(t, "r", "users")
	a := e.startNode(t, "A", "users")
	b := e.startNode(t, "B", "users")
	c := e.startNode(t, "C", "users")
	e.startRelay(t, "r", "users") // the standby
	ctx := context.Background()
	other, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	const n = 1500
	var without, passed int
	lat := make([]time.Duration, 0, 2*n)
	for i := range n {
		if i == n/3 {
			stop1() // the standby takes over
			t.Log("the relay stopped: the standby takes over")
		}
		id := int64(10_000 + i)
		if i%2 == 0 {
			a.insert(t, id)
		} else if _, err := other.Exec(ctx, `INSERT INTO users VALUES ($1, 'other')`, id); err != nil {
			t.Fatal(err)
		}
		tok, err := postgres.WriteToken(ctx, a.pool)
		if err != nil {
			t.Fatal(err)
		}
		if b.loader.Ready() && !b.loader.MayContain(id) {
			without++
		}
		for _, r := range []*node{b, c} {
			before := r.loader.Stats().TokenPassed
			start := time.Now()
			_, err := r.loader.Get(guarded.WithToken(ctx, tok), id)
			lat = append(lat, time.Since(start))
			if errors.Is(err, guarded.ErrNotFound) {
				t.Fatalf("row %d: 404 on %s under its token %v (at %v)", id, r.id, tok, r.loader.Position())
			} else if err != nil {
				t.Fatal(err)
			}
			if r.loader.Stats().TokenPassed > before {
				passed++
			}
		}
	}
	slices.Sort(lat)
	t.Logf("%d rows created on A (or by another client), each read at once on B and C under its token: 0 not found; %d would have been 404 on B without it; %d of %d lookups passed through after waiting %v; Get latency with the token p50 %v p99 %v max %v",
		n, without, passed, len(lat), guarded.DefaultTokenWait, lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])
	for _, r := range []*node{b, c} {
		if st := r.loader.Stats(); st.TokenForeign != 0 || st.TokenLookups != n {
			t.Errorf("%s: %d token lookups, %d of another stream: the follower does not report its database's positions", r.id, st.TokenLookups, st.TokenForeign)
		}
	}
	expectNoWrong404s(t, b, "after the run")
}
