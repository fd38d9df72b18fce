package rpcguard_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cuckooguard/cuckooguard/rpcguard"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
)

// benchUsers is the number of users in the benchmarks' store, ids
// 1..benchUsers; unknown ids are above it.
const benchUsers = 1 << 16

// benchID returns the i-th id of a benchmark: a known one, or an unknown
// one.
func benchID(i int, known bool) int64 {
	if known {
		return int64(i&(benchUsers-1)) + 1
	}
	return benchUsers + 1 + int64(i&(benchUsers-1))
}

// BenchmarkUnary times one GetUser call over loopback TCP, from a client
// in the same process, through the interceptor and without it, for a
// known and an unknown id. The handler asks a filled Loader, as a
// service's handler does: without the interceptor an unknown id costs the
// call of the handler, whose Loader answers ErrNotFound from the guard
// (no store call either way).
func BenchmarkUnary(b *testing.B) {
	s := newStore(benchUsers)
	loader := newLoader(b, s, true)
	ic, err := rpcguard.New(loader, rpcguard.Keys[int64]{getUser: rpcguard.Field[int64]("id")})
	if err != nil {
		b.Fatal(err)
	}
	sv := &service{s: s, loader: loader}
	for _, transport := range []string{"grpc", "connect"} {
		for _, on := range []bool{false, true} {
			cfg := serverConfig{}
			if on {
				cfg = serverConfig{unary: []grpc.UnaryServerInterceptor{ic.Unary()}, connect: []connect.Interceptor{ic}}
			}
			srv := startServer(b, transport, sv, cfg)
			for _, known := range []bool{true, false} {
				b.Run("transport="+transport+"/interceptor="+onOff(on)+"/id="+knownUnknown(known), func(b *testing.B) {
					ctx := context.Background()
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						_, err := srv.client.GetUser(ctx, benchID(i, known))
						if (err == nil) != known {
							b.Fatalf("GetUser(%d): %v", benchID(i, known), err)
						}
						i++
					}
				})
			}
		}
	}
}

// BenchmarkInterceptor times what the gRPC unary interceptor adds to a
// call, without the network: the interceptor and the handler called as
// the server calls them, against the handler alone. The handler is the
// service's (handler=loader: the Loader's Get, whose guard answers
// unknown ids itself), or one that does nothing (handler=noop), which
// leaves the interceptor's own cost.
func BenchmarkInterceptor(b *testing.B) {
	s := newStore(benchUsers)
	loader := newLoader(b, s, true)
	ic, err := rpcguard.New(loader, rpcguard.Keys[int64]{getUser: rpcguard.Field[int64]("id")})
	if err != nil {
		b.Fatal(err)
	}
	sv := &service{s: s, loader: loader}
	handlers := []struct {
		name string
		h    grpc.UnaryHandler
	}{
		{"loader", func(ctx context.Context, req any) (any, error) {
			return sv.GetUser(ctx, req.(*testpb.GetUserRequest))
		}},
		{"noop", func(ctx context.Context, req any) (any, error) {
			if req.(*testpb.GetUserRequest).GetId() > benchUsers {
				return nil, errNotFound
			}
			return req, nil
		}},
	}
	unary := ic.Unary()
	info := &grpc.UnaryServerInfo{FullMethod: getUser}
	reqs := make([]*testpb.GetUserRequest, benchUsers)
	for _, hd := range handlers {
		for _, on := range []bool{false, true} {
			for _, known := range []bool{true, false} {
				for i := range reqs {
					reqs[i] = &testpb.GetUserRequest{Id: benchID(i, known)}
				}
				handler := hd.h
				b.Run("handler="+hd.name+"/interceptor="+onOff(on)+"/id="+knownUnknown(known), func(b *testing.B) {
					ctx := context.Background()
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						req := reqs[i&(benchUsers-1)]
						var err error
						if on {
							_, err = unary(ctx, req, info, handler)
						} else {
							_, err = handler(ctx, req)
						}
						if (err == nil) != known {
							b.Fatalf("GetUser(%d): %v", req.GetId(), err)
						}
						i++
					}
				})
			}
		}
	}
}

// errNotFound is the no-op handler's NotFound, made once.
var errNotFound = status.Error(codes.NotFound, "user not found")

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func knownUnknown(known bool) string {
	if known {
		return "known"
	}
	return "unknown"
}
