package rpcguard_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/rpcguard"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb/testpbconnect"
)

// TestTokenRoundTrip, over gRPC and Connect: a write (Ping, not guarded,
// whose handler records a token as pgguard's Table writes do) is answered
// with its token in the response's metadata; a GetUser that carries it
// back, for a user created elsewhere whose change this replica's stream
// has not applied, waits for the stream and finds the user, where the
// same call without it gets the guard's NotFound. A token that does not
// read passes the call, and the handler's lookup, through to the store.
func TestTokenRoundTrip(t *testing.T) {
	for _, transport := range []string{"grpc", "connect"} {
		t.Run(transport, func(t *testing.T) {
			s := newStore(100)
			l, feed := fedLoader(t, s.lookup)
			if err := feed.Resync(context.Background(), func(ctx context.Context, add func(int64) error) error {
				for id := int64(1); id <= 100; id++ {
					if err := add(id); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			at := func(pos uint64) guarded.Token { tok, _ := guarded.NewToken("db", pos); return tok }
			feed.Reached(at(10))
			feed.ReadyUntil(time.Now().Add(time.Hour))
			ic, err := rpcguard.New(l, rpcguard.Keys[int64]{testpb.Users_GetUser_FullMethodName: rpcguard.Field[int64]("id")})
			if err != nil {
				t.Fatal(err)
			}
			var created atomic.Int64
			write := func(ctx context.Context) { // the Ping handler's write, on another replica's stream
				id := 500 + created.Add(1)
				s.mu.Lock()
				s.names[id] = "new"
				s.mu.Unlock()
				guarded.Wrote(ctx, at(20))
			}
			sv := &service{s: s, loader: l}
			streamTok := at(30) // what a streaming write (Rename, not guarded) records
			cfg := serverConfig{
				stream: []grpc.StreamServerInterceptor{ic.Stream(), func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
					guarded.Wrote(ss.Context(), streamTok)
					return h(srv, ss)
				}},
				unary: []grpc.UnaryServerInterceptor{ic.Unary(), func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
					if info.FullMethod == testpb.Users_Ping_FullMethodName {
						write(ctx)
					}
					return h(ctx, req)
				}},
				connect: []connect.Interceptor{ic, streamWriter{streamTok, func(next connect.UnaryFunc) connect.UnaryFunc {
					return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
						if req.Spec().Procedure == testpb.Users_Ping_FullMethodName {
							write(ctx)
						}
						return next(ctx, req)
					}
				}}},
			}
			srv := startServer(t, transport, sv, cfg)
			ctx := testCtx(t)
			// ping writes and returns the token; get looks user id up
			// under a token (none: "").
			var ping, rename func() string
			var get func(id int64, token string) error
			if transport == "grpc" {
				c := testpb.NewUsersClient(dial(t, srv.addr))
				rename = func() string {
					st, err := c.Rename(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if err := st.Send(&testpb.RenameRequest{Id: 1, Name: "x"}); err != nil {
						t.Fatal(err)
					}
					if _, err := st.CloseAndRecv(); err != nil {
						t.Fatal(err)
					}
					md, _ := st.Header()
					return first(append(md.Get(rpcguard.TokenMetadata), st.Trailer().Get(rpcguard.TokenMetadata)...))
				}
				ping = func() string {
					var md metadata.MD
					if _, err := c.Ping(ctx, &testpb.Empty{}, grpc.Header(&md)); err != nil {
						t.Fatal(err)
					}
					return first(md.Get(rpcguard.TokenMetadata))
				}
				get = func(id int64, token string) error {
					ctx := ctx
					if token != "" {
						ctx = metadata.AppendToOutgoingContext(ctx, rpcguard.TokenMetadata, token)
					}
					_, err := c.GetUser(ctx, &testpb.GetUserRequest{Id: id})
					return err
				}
			} else {
				c := testpbconnect.NewUsersClient(http.DefaultClient, "http://"+srv.addr)
				rename = func() string {
					st := c.Rename(ctx)
					if err := st.Send(&testpb.RenameRequest{Id: 1, Name: "x"}); err != nil {
						t.Fatal(err)
					}
					resp, err := st.CloseAndReceive()
					if err != nil {
						t.Fatal(err)
					}
					if v := resp.Header().Get(rpcguard.TokenMetadata); v != "" {
						return v
					}
					return resp.Trailer().Get(rpcguard.TokenMetadata)
				}
				ping = func() string {
					resp, err := c.Ping(ctx, connect.NewRequest(&testpb.Empty{}))
					if err != nil {
						t.Fatal(err)
					}
					return resp.Header().Get(rpcguard.TokenMetadata)
				}
				get = func(id int64, token string) error {
					req := connect.NewRequest(&testpb.GetUserRequest{Id: id})
					if token != "" {
						req.Header().Set(rpcguard.TokenMetadata, token)
					}
					_, err := c.GetUser(ctx, req)
					return err
				}
			}
			token := ping()
			if token != "db.14" {
				t.Fatalf("the write's response carries token %q, want db.14", token)
			}
			if err := get(501, ""); !rpcguard.FromGuard(err) {
				t.Fatalf("without the token: %v; the test proves nothing unless the guard says NotFound", err)
			}
			go func() {
				time.Sleep(20 * time.Millisecond)
				feed.Apply(guarded.Change[int64]{Key: 501})
				feed.Reached(at(20))
			}()
			if err := get(501, token); err != nil {
				t.Fatalf("with the token: %v", err)
			}
			ping() // user 502: its change never comes; the lookup waits and asks the store
			if err := get(502, "not a token"); err != nil {
				t.Fatalf("with a token that does not read: %v, want the store's answer", err)
			}
			if err := get(404404, token); !rpcguard.FromGuard(err) {
				t.Fatalf("an absent user under a reached token: %v", err)
			}
			if got := rename(); got != streamTok.String() {
				t.Fatalf("a streaming write's response carries token %q, want %v", got, streamTok)
			}
			st := ic.Stats()
			if st.Tokens != 3 || st.TokensRefused != 1 || st.TokensSet != 3 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// streamWriter is a Connect interceptor whose streaming handlers record
// tok, as a handler's write does, and whose unary ones are wrap's.
type streamWriter struct {
	tok  guarded.Token
	wrap func(connect.UnaryFunc) connect.UnaryFunc
}

func (w streamWriter) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return w.wrap(next) }

func (w streamWriter) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (w streamWriter) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		guarded.Wrote(ctx, w.tok)
		return next(ctx, conn)
	}
}
