package rpcguard_test

import (
	"context"
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/cuckooguard/cuckooguard/rpcguard"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
)

// fuzzSeeds are requests of the Kinds method, as a client sends them.
func fuzzSeeds(f *testing.F) {
	for _, m := range []*testpb.AllKinds{
		{},
		{I64: 42},
		{I64: -1, Raw: []byte("key"), U64: 1<<64 - 1, Str: "ada"},
		{OptI64: ptr(int64(0)), Choice: &testpb.AllKinds_OneId{OneId: 7}},
		{Choice: &testpb.AllKinds_OneName{OneName: "x"}, List: []int64{1, 2}, ByName: map[string]int64{"a": 1}, User: &testpb.User{Id: 1}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x20, 0x80})                         // field 4 (i64), a truncated varint
	f.Add([]byte{0xa0, 0x01, 0x05, 0xa0, 0x01, 0x00}) // one_id set twice
}

// FuzzField decodes the request bytes a client sent and takes keys from
// them with Field: it never panics, asks the filter about exactly the
// fields that are set, with their values, and otherwise passes the
// request to the handler.
func FuzzField(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var m testpb.AllKinds
		if proto.Unmarshal(data, &m) != nil {
			return // grpc answers such a request before any interceptor
		}
		fields := m.ProtoReflect().Descriptor().Fields()
		fuzzKey(t, &m, "i64", rpcguard.Field[int64]("i64"), func(v protoreflect.Value) int64 { return v.Int() }, fields)
		fuzzKey(t, &m, "opt_i64", rpcguard.Field[int64]("opt_i64"), func(v protoreflect.Value) int64 { return v.Int() }, fields)
		fuzzKey(t, &m, "one_id", rpcguard.Field[int64]("one_id"), func(v protoreflect.Value) int64 { return v.Int() }, fields)
		fuzzKey(t, &m, "u64", rpcguard.Field[uint64]("u64"), func(v protoreflect.Value) uint64 { return v.Uint() }, fields)
		fuzzKey(t, &m, "raw", rpcguard.Field[string]("raw"), func(v protoreflect.Value) string { return string(v.Bytes()) }, fields)
		fuzzKey(t, &m, "str", rpcguard.Field[string]("str"), func(v protoreflect.Value) string { return v.String() }, fields)
	})
}

func fuzzKey[K comparable](t *testing.T, m *testpb.AllKinds, name string, key rpcguard.Key[K], want func(protoreflect.Value) K, fields protoreflect.FieldDescriptors) {
	t.Helper()
	fd := fields.ByName(protoreflect.Name(name))
	got, ok := keyOf(t, kinds, key, m)
	set := m.ProtoReflect().Has(fd)
	if ok != set {
		t.Fatalf("field %s set: %v, key asked about: %v", name, set, ok)
	}
	if set && got != want(m.ProtoReflect().Get(fd)) {
		t.Fatalf("field %s: key %v, want %v", name, got, want(m.ProtoReflect().Get(fd)))
	}
}

// fuzzStream is a server stream whose client sent one message, data.
type fuzzStream struct {
	grpc.ServerStream
	data []byte
	sent bool
}

func (s *fuzzStream) Context() context.Context { return context.Background() }

func (s *fuzzStream) RecvMsg(m any) error {
	if s.sent {
		return io.EOF
	}
	s.sent = true
	return proto.Unmarshal(s.data, m.(proto.Message))
}

// FuzzStream reads a stream's first message from the client's bytes, as
// the stream interceptor does: a message whose key the filter says may
// exist reaches the handler exactly as the client sent it, unknown fields
// included; bytes that do not decode reach the handler as the same error.
func FuzzStream(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		ic, err := rpcguard.New[int64](allow{}, rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("i64")})
		if err != nil {
			t.Fatal(err)
		}
		var want testpb.AllKinds
		wantErr := proto.Unmarshal(data, &want)
		ran := false
		err = ic.Stream()(nil, &fuzzStream{data: data}, &grpc.StreamServerInfo{FullMethod: kinds}, func(_ any, ss grpc.ServerStream) error {
			ran = true
			var got testpb.AllKinds
			err := ss.RecvMsg(&got)
			if (err != nil) != (wantErr != nil) {
				t.Fatalf("handler's first RecvMsg: %v, want %v", err, wantErr)
			}
			if err == nil && !proto.Equal(&got, &want) {
				t.Fatalf("handler received %v, client sent %v", &got, &want)
			}
			if err == nil && string(got.ProtoReflect().GetUnknown()) != string(want.ProtoReflect().GetUnknown()) {
				t.Fatalf("unknown fields %x, client sent %x", got.ProtoReflect().GetUnknown(), want.ProtoReflect().GetUnknown())
			}
			if err := ss.RecvMsg(&got); err != io.EOF {
				t.Fatalf("second RecvMsg: %v, want the stream's own EOF", err)
			}
			return nil
		})
		if err != nil || !ran {
			t.Fatalf("interceptor: %v, handler ran: %v", err, ran)
		}
	})
}

// allow is a Filter that says every key may exist.
type allow struct{}

func (allow) MayContain(int64) bool { return true }
