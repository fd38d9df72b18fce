package runset

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guarded"
)

type code string

// TestParseFor: a given parse wins, then one of more for K, then the
// key types that need none; any other type is refused.
func TestParseFor(t *testing.T) {
	p, err := ParseFor[uint32](nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p("4294967295"); err != nil || n != 1<<32-1 {
		t.Errorf("uint32 parse = %d, %v", n, err)
	}
	if _, err := p("4294967296"); err == nil {
		t.Error("uint32 parse of 2^32: no error")
	}
	own := func(s string) (code, error) { return code(strings.ToUpper(s)), nil }
	c, err := ParseFor[code](nil, func(string) (int, error) { return 0, nil }, own)
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := c("ab"); k != "AB" {
		t.Errorf("a database's own parse was not chosen: %q", k)
	}
	if _, err := ParseFor[code](nil); err == nil || !strings.Contains(err.Error(), "need a Parse") {
		t.Errorf("a key type without a parse: %v", err)
	}
	given := func(s string) (string, error) { return "given", nil }
	s, _ := ParseFor(given, func(string) (string, error) { return "more", nil })
	if k, _ := s("x"); k != "given" {
		t.Errorf("the given parse lost to %q", k)
	}
}

// TestNewLoader: a table without Get, or whose estimate fails, is an
// error naming it; the estimate is asked only without a Capacity; the
// Loader answers with the store's not-found for the guard's.
func TestNewLoader(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	notFound := errors.New("no row")
	isNotFound := func(err error) bool { return errors.Is(err, notFound) }
	failing := func(context.Context) (int, error) { return 0, errors.New("no estimate") }
	if _, err := NewLoader(ctx, "pkg", Table[string, int]{Name: "t"}, isNotFound, failing, log); err == nil || !strings.Contains(err.Error(), "pkg: table t has no Get") {
		t.Errorf("no Get: %v", err)
	}
	get := func(_ context.Context, k string) (int, error) {
		if k == "a" {
			return 1, nil
		}
		return 0, notFound
	}
	if _, err := NewLoader(ctx, "pkg", Table[string, int]{Name: "t", Get: get}, isNotFound, failing, log); err == nil || err.Error() != "no estimate" {
		t.Errorf("a failing estimate: %v", err)
	}
	l, err := NewLoader(ctx, "pkg", Table[string, int]{Name: "t", Get: get, Capacity: 1000}, isNotFound, failing, log)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if v, err := l.Get(ctx, "a"); v != 1 || err != nil {
		t.Errorf("Get(a) = %d, %v", v, err)
	}
	if _, err := l.Get(ctx, "b"); !errors.Is(err, guarded.ErrNotFound) && !errors.Is(err, notFound) {
		t.Errorf("Get(b) = %v, want a not-found", err)
	}
	if _, err := NewLoader(ctx, "pkg", Table[string, int]{Name: "t", Get: get, Capacity: -1}, isNotFound, failing, log); err == nil || !strings.HasPrefix(err.Error(), "pkg: table t: ") {
		t.Errorf("a negative capacity: %v", err)
	}
}

// TestRelayedWhy names the first reason in the order an operator acts on.
func TestRelayedWhy(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		nats         bool
		state        follow.State
		silence, lag time.Duration
		err          error
		want         string
	}{
		{false, follow.Following, 0, 0, nil, "NATS connection down"},
		{true, follow.Behind, 2 * time.Second, time.Second, nil, "relay silent for 2s"},
		{true, follow.Behind, 0, 300 * time.Millisecond, nil, "follower behind (lag 300ms)"},
		{true, follow.PassThrough, 0, 0, boom, "follower pass-through: boom"},
		{true, follow.Resyncing, 0, 0, boom, "follower " + follow.Resyncing.String()},
	} {
		if got := RelayedWhy(tc.nats, tc.state, tc.silence, tc.lag, tc.err); got != tc.want {
			t.Errorf("RelayedWhy(%v, %v, %v, %v, %v) = %q, want %q", tc.nats, tc.state, tc.silence, tc.lag, tc.err, got, tc.want)
		}
	}
}
