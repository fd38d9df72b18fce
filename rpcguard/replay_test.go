package rpcguard

import (
	"errors"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
)

// TestReplay checks the first receive of a guarded stream, as both
// transports' wrappers give it: a copy of the message the interceptor
// read, or its error, once; a handler that receives into another type
// gets the transport's Internal error.
func TestReplay(t *testing.T) {
	first := &testpb.GetUserRequest{Id: 42}
	r := replay{first: first, internal: grpcInternal}
	var got testpb.GetUserRequest
	if ok, err := r.take(&got); !ok || err != nil || !proto.Equal(&got, first) {
		t.Fatalf("first take: %v, %v, %v; want true, nil, a copy of %v", ok, err, &got, first)
	}
	if ok, _ := r.take(&got); ok {
		t.Fatal("a second take answered: the stream's own receive must")
	}

	broken := errors.New("stream broke")
	r = replay{err: broken, internal: grpcInternal}
	if ok, err := r.take(&got); !ok || err != broken {
		t.Fatalf("take after a failed receive: %v, %v; want true, %v", ok, err, broken)
	}

	for _, c := range []struct {
		internal func(error) error
		code     func(error) bool
	}{
		{grpcInternal, func(err error) bool { return status.Code(err) == codes.Internal }},
		{connectInternal, func(err error) bool { return connect.CodeOf(err) == connect.CodeInternal }},
	} {
		r = replay{first: first, internal: c.internal}
		if ok, err := r.take(&testpb.User{}); !ok || !c.code(err) {
			t.Errorf("take into another message type: %v, %v; want true and Internal", ok, err)
		}
	}
}
