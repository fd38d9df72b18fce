package postgres

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cuckooguard/cuckooguard/guarded"
)

func TestCommitBound(t *testing.T) {
	const block, seg = 8192, 16 << 20
	for _, c := range []struct{ in, want pglogrepl.LSN }{
		{0x1000, 0x1000},
		{3*block + 24, 3 * block},    // past a page header: the page's end
		{5*seg + 40, 5 * seg},        // past a segment's long header
		{3*block + 25, 3*block + 25}, // inside a page
		{5*seg + 24, 5*seg + 24},     // a segment's first page has the long header
		{3*block + 48, 3*block + 48}, // a record's end
	} {
		if got := commitBound(c.in, block, seg); got != c.want {
			t.Errorf("commitBound(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	for s, want := range map[string]int64{"16MB": 16 << 20, "8kB": 8192, "1GB": 1 << 30, "4096": 4096} {
		if got, err := parseSize(s); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v", s, got, err)
		}
	}
}

// TestReadYourWritesDirect: a client creates a row through replica A (and
// through a client of no replica's) and at once, with no sleep, looks it
// up on replica B under the write's token (WriteToken): B finds every row.
// The same lookup on B's guard without the token is counted: those are
// the 404s the token exists to prevent.
func TestReadYourWritesDirect(t *testing.T) {
	dsn := setupUsers(t, 100)
	a := startReplicaOn(t, dsn, dsn, "users", "A")
	b := startReplicaOn(t, dsn, dsn, "users", "B")
	ctx := context.Background()
	other := connect(t, dsn)
	const n = 1000
	var without, waited int
	lat := make([]time.Duration, 0, n)
	for i := range n {
		id := int64(10_000 + i)
		var err error
		if i%2 == 0 {
			err = a.insert(ctx, id)
		} else {
			_, err = other.Exec(ctx, `INSERT INTO users (id, name) VALUES ($1, 'other')`, id)
		}
		if err != nil {
			t.Fatal(err)
		}
		tok, err := WriteToken(ctx, a.pool)
		if err != nil {
			t.Fatal(err)
		}
		if !b.loader.MayContain(id) {
			without++
		}
		before := b.loader.Stats().TokenWaits
		start := time.Now()
		_, err = b.loader.Get(guarded.WithToken(ctx, tok), id)
		lat = append(lat, time.Since(start))
		if errors.Is(err, guarded.ErrNotFound) {
			t.Fatalf("row %d: 404 on B under its token %v (B at %v, %+v)", id, tok, b.loader.Position(), b.follower.Stats())
		} else if err != nil {
			t.Fatal(err)
		}
		if b.loader.Stats().TokenWaits > before {
			waited++
		}
	}
	st := b.loader.Stats()
	slices.Sort(lat)
	t.Logf("%d rows created on A (or by another client) and read at once on B under their token: 0 not found; %d would have been 404 without it; %d lookups waited, %d passed through after the wait; Get latency with the token p50 %v p99 %v",
		n, without, waited, st.TokenPassed, lat[n/2], lat[n*99/100])
	if st.TokenLookups != n {
		t.Errorf("TokenLookups = %d, want %d", st.TokenLookups, n)
	}
}
