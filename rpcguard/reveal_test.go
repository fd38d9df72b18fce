package rpcguard_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/rpcguard"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
)

// TestRejectionRevealsNothing is the leak of issue 49: an authenticated
// tenant asks for another tenant's row, which the handler hides with its
// own NotFound ("user not found"), and for an id that does not exist,
// which the guard rejects. With WithRejection set to the handler's own
// status the two answers are the same bytes on the wire, over gRPC,
// Connect and Connect's gRPC protocol; without it the guard's answer
// carries its ErrorInfo and the two differ, which the test checks too.
func TestRejectionRevealsNothing(t *testing.T) {
	const (
		hidden = 75   // another tenant's row: in the table and the guard
		absent = 5000 // no row
	)
	for _, transport := range transports {
		for _, identical := range []bool{true, false} {
			t.Run(fmt.Sprintf("transport=%s/rejection=%v", transport, map[bool]string{true: "handler's", false: "default"}[identical]), func(t *testing.T) {
				s := newStore(100)
				// The tenant's session: the rows of ids above 50 belong to
				// another tenant, and its lookups do not see them.
				tenantLookup := func(ctx context.Context, id int64) (string, error) {
					if id > 50 {
						return "", guarded.ErrNotFound
					}
					return s.lookup(ctx, id)
				}
				g, err := guard.New()
				if err != nil {
					t.Fatal(err)
				}
				l, err := guarded.New(g, guarded.GetterFunc[int64, string](tenantLookup))
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				fill(t, l, s) // the guard holds every tenant's ids
				var opts []rpcguard.Option
				if identical {
					opts = append(opts, rpcguard.WithRejection(status.New(codes.NotFound, "user not found")))
				}
				ic, err := rpcguard.New(l, rpcguard.Keys[int64]{testpb.Users_GetUser_FullMethodName: rpcguard.Field[int64]("id")}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				sv := &service{s: s, loader: l}
				srv := startServer(t, transport, sv, serverConfig{unary: []grpc.UnaryServerInterceptor{ic.Unary()}, connect: []connect.Interceptor{ic}})
				ctx := testCtx(t)
				hiddenAnswer := wire(ctx, t, transport, srv, hidden)
				absentAnswer := wire(ctx, t, transport, srv, absent)
				if calls := s.callsOf("GetUser"); calls != 1 {
					t.Fatalf("the handler ran %d times, want once (for the hidden row; the guard answers for the absent id)", calls)
				}
				switch same := bytes.Equal(hiddenAnswer, absentAnswer); {
				case identical && !same:
					t.Errorf("another tenant's row and an absent id are told apart:\nhidden: %q\nabsent: %q", hiddenAnswer, absentAnswer)
				case !identical && same:
					t.Errorf("without WithRejection the guard's answer is the handler's (%q): want its ErrorInfo", absentAnswer)
				}
			})
		}
	}
}

// wire returns what a client of transport receives for GetUser(id), as
// bytes: for Connect over HTTP/1.1 the response's status line, content
// type and body as read from the connection; over the gRPC protocols the
// status's code, message and details as their trailers carry them (the
// grpc-status-details-bin trailer is the marshalled google.rpc.Status).
func wire(ctx context.Context, t *testing.T, transport string, srv *server, id int64) []byte {
	t.Helper()
	if transport == "connect" {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+srv.addr+testpb.Users_GetUser_FullMethodName,
			strings.NewReader(`{"id":"`+strconv.FormatInt(id, 10)+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Appendf(nil, "%s\n%s\n%s", resp.Status, resp.Header.Get("Content-Type"), body)
	}
	_, err := srv.client.GetUser(ctx, id)
	if err == nil {
		t.Fatalf("GetUser(%d) succeeded, want NotFound", id)
	}
	var st *status.Status
	if ce := new(connect.Error); errors.As(err, &ce) {
		st = status.New(codes.Code(ce.Code()), ce.Message())
		p := st.Proto()
		for _, d := range ce.Details() {
			p.Details = append(p.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
		}
		st = status.FromProto(p)
	} else {
		st = status.Convert(err)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(st.Proto())
	if err != nil {
		t.Fatal(err)
	}
	return b
}
