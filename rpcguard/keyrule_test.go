package rpcguard_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/cuckooguard/cuckooguard/rpcguard"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
)

// TestFieldThroughKeyRule: a Field key goes to the Loader as the request
// carries it, and the Loader's key rule (installed by its change feed, as
// the postgres followers do for a citext column) finds the stored key in
// any case: the handler runs for every spelling of a stored name, and an
// absent name gets the guard's NotFound.
func TestFieldThroughKeyRule(t *testing.T) {
	l, feed := fedLoader(t, func(context.Context, string) (string, error) { return "row", nil })
	feed.SetKeyRule(func(k string) (string, error) { return strings.ToLower(k), nil })
	if err := feed.Resync(context.Background(), func(ctx context.Context, add func(string) error) error { return add("ada@example.com") }); err != nil {
		t.Fatal(err)
	}
	feed.ReadyUntil(time.Now().Add(time.Hour))
	ic, err := rpcguard.New[string](l, rpcguard.Keys[string]{testpb.Users_GetByName_FullMethodName: rpcguard.Field[string]("name")})
	if err != nil {
		t.Fatal(err)
	}
	info := &grpc.UnaryServerInfo{FullMethod: testpb.Users_GetByName_FullMethodName}
	for name, wantRun := range map[string]bool{"Ada@Example.com": true, "ADA@EXAMPLE.COM": true, "ada@example.com": true, "Bob@Example.com": false} {
		ran := false
		_, err := ic.Unary()(context.Background(), &testpb.GetByNameRequest{Name: name}, info, func(context.Context, any) (any, error) {
			ran = true
			return nil, nil
		})
		if ran != wantRun || wantRun && err != nil || !wantRun && !rpcguard.FromGuard(err) {
			t.Errorf("GetByName(%q): handler ran %v, %v; want ran %v", name, ran, err, wantRun)
		}
	}
}
