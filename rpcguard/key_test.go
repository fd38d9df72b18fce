package rpcguard_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/cuckooguard/cuckooguard/rpcguard"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
)

const kinds = testpb.Users_Kinds_FullMethodName

// recordFilter is a Filter that says every key is absent, and records the
// keys it was asked about.
type recordFilter[K comparable] struct{ keys *[]K }

func (f recordFilter[K]) MayContain(k K) bool {
	*f.keys = append(*f.keys, k)
	return false
}

// keyOf runs the unary interceptor of method over req with key, and
// returns the key the filter was asked about; ok is false if it was asked
// about none (a missing key: the handler ran).
func keyOf[K comparable](t *testing.T, method string, key rpcguard.Key[K], req proto.Message) (got K, ok bool) {
	t.Helper()
	var keys []K
	ic, err := rpcguard.New[K](recordFilter[K]{&keys}, rpcguard.Keys[K]{method: key})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = ic.Unary()(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	switch {
	case len(keys) == 0 && !ran:
		t.Fatal("no key asked about, and the handler did not run")
	case len(keys) > 1:
		t.Fatalf("asked about %v", keys)
	case len(keys) == 1 && (ran || !rpcguard.FromGuard(err)):
		t.Fatalf("key %v absent, and the handler ran (%v) or the error was %v", keys[0], ran, err)
	case len(keys) == 1:
		return keys[0], true
	}
	return got, false
}

func ptr[T any](v T) *T { return &v }

// TestFieldConverts takes keys of each type from fields of each kind that
// converts to it without loss.
func TestFieldConverts(t *testing.T) {
	msg := &testpb.AllKinds{
		I32: -32, S32: -33, Sf32: -34, I64: -1 << 40, S64: -1 << 41, Sf64: -1 << 42,
		U32: 1 << 31, F32: 1<<32 - 1, U64: 1 << 63, F64: 1<<64 - 1,
		Str: "ada", Raw: []byte{0, 0xff, 'x'},
		OptI64: ptr(int64(0)), Choice: &testpb.AllKinds_OneId{OneId: 0},
	}
	check := func(t *testing.T, field string, got, want any, ok bool) {
		t.Helper()
		if !ok || got != want {
			t.Errorf("field %s: key %v (asked: %v), want %v", field, got, ok, want)
		}
	}
	for _, tc := range []struct {
		field string
		want  int64
	}{{"i32", -32}, {"s32", -33}, {"sf32", -34}, {"i64", -1 << 40}, {"s64", -1 << 41}, {"sf64", -1 << 42}, {"opt_i64", 0}, {"one_id", 0}} {
		got, ok := keyOf(t, kinds, rpcguard.Field[int64](tc.field), msg)
		check(t, tc.field, got, tc.want, ok)
	}
	for _, tc := range []struct {
		field string
		want  int32
	}{{"i32", -32}, {"s32", -33}, {"sf32", -34}} {
		got, ok := keyOf(t, kinds, rpcguard.Field[int32](tc.field), msg)
		check(t, tc.field, got, tc.want, ok)
	}
	for _, tc := range []struct {
		field string
		want  uint64
	}{{"u32", 1 << 31}, {"f32", 1<<32 - 1}, {"u64", 1 << 63}, {"f64", 1<<64 - 1}} {
		got, ok := keyOf(t, kinds, rpcguard.Field[uint64](tc.field), msg)
		check(t, tc.field, got, tc.want, ok)
	}
	for _, tc := range []struct {
		field string
		want  uint32
	}{{"u32", 1 << 31}, {"f32", 1<<32 - 1}} {
		got, ok := keyOf(t, kinds, rpcguard.Field[uint32](tc.field), msg)
		check(t, tc.field, got, tc.want, ok)
	}
	for _, tc := range []struct {
		field string
		want  string
	}{{"str", "ada"}, {"raw", "\x00\xffx"}} {
		got, ok := keyOf(t, kinds, rpcguard.Field[string](tc.field), msg)
		check(t, tc.field, got, tc.want, ok)
	}
	// A bytea key: the bytes as the database prints them.
	got, ok := keyOf(t, kinds, rpcguard.Bytea("raw"), msg)
	check(t, "raw (Bytea)", got, `\x00ff78`, ok)
	for _, field := range []string{"str", "list", "nope"} {
		if _, err := rpcguard.New[string](recordFilter[string]{new([]string)}, rpcguard.Keys[string]{kinds: rpcguard.Bytea(field)}); err == nil {
			t.Errorf("Bytea(%q) accepted", field)
		}
	}
}

// TestFieldMissing: a field that is not set is a missing key, and the
// request passes: proto3's zero values, an optional field not set, a
// oneof that holds the other member, and a request of another type.
func TestFieldMissing(t *testing.T) {
	other := &testpb.AllKinds{Choice: &testpb.AllKinds_OneName{OneName: "x"}}
	for _, tc := range []struct {
		name string
		key  rpcguard.Key[int64]
		req  proto.Message
	}{
		{"zero int64", rpcguard.Field[int64]("i64"), &testpb.AllKinds{}},
		{"optional not set", rpcguard.Field[int64]("opt_i64"), &testpb.AllKinds{}},
		{"oneof holds the other member", rpcguard.Field[int64]("one_id"), other},
		{"request of another type", rpcguard.Field[int64]("i64"), &testpb.GetUserRequest{Id: 5}},
		{"func: request of another type", rpcguard.Func(func(m *testpb.AllKinds) (int64, bool) { return m.GetI64(), true }), &testpb.GetUserRequest{Id: 5}},
		{"func says missing", rpcguard.Func(func(m *testpb.AllKinds) (int64, bool) { return 0, false }), &testpb.AllKinds{I64: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if k, ok := keyOf(t, kinds, tc.key, tc.req); ok {
				t.Fatalf("asked about key %v, want a missing key", k)
			}
		})
	}
	if k, ok := keyOf(t, kinds, rpcguard.Field[string]("str"), &testpb.AllKinds{Str: ""}); ok {
		t.Fatalf("empty string: asked about %q, want a missing key", k)
	}
}

// TestFieldDynamicMessage: a request that is a dynamic message of the
// method's type (another descriptor of it) gives its key.
func TestFieldDynamicMessage(t *testing.T) {
	m := dynamicpb.NewMessage((&testpb.GetUserRequest{}).ProtoReflect().Descriptor())
	if err := proto.Unmarshal(mustMarshal(t, &testpb.GetUserRequest{Id: 77}), m); err != nil {
		t.Fatal(err)
	}
	if k, ok := keyOf(t, getUser, rpcguard.Field[int64]("id"), m); !ok || k != 77 {
		t.Fatalf("dynamic message: key %v (%v), want 77", k, ok)
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNewRefuses: New says what is wrong with a method or a Key, at once.
func TestNewRefuses(t *testing.T) {
	f := recordFilter[int64]{new([]int64)}
	for _, tc := range []struct {
		name string
		keys rpcguard.Keys[int64]
		want string // in the error
	}{
		{"no methods", nil, "at least one method"},
		{"no leading slash", rpcguard.Keys[int64]{"rpcguard.test.v1.Users/GetUser": rpcguard.Field[int64]("id")}, "not a full method name"},
		{"no method", rpcguard.Keys[int64]{"/rpcguard.test.v1.Users/": rpcguard.Field[int64]("id")}, "not a full method name"},
		{"dotted method", rpcguard.Keys[int64]{"/rpcguard.test.v1.Users.GetUser": rpcguard.Field[int64]("id")}, "not a full method name"},
		{"unknown method", rpcguard.Keys[int64]{"/rpcguard.test.v1.Users/Nope": rpcguard.Field[int64]("id")}, "not found"},
		{"unknown service", rpcguard.Keys[int64]{"/nope.v1.Nope/GetUser": rpcguard.Field[int64]("id")}, "not found"},
		{"a message, not a method", rpcguard.Keys[int64]{"/rpcguard.test.v1/User": rpcguard.Field[int64]("id")}, "not a method"},
		{"zero Key", rpcguard.Keys[int64]{getUser: {}}, "empty Key"},
		{"no such field", rpcguard.Keys[int64]{getUser: rpcguard.Field[int64]("ID")}, "GetUserRequest has no such field"},
		{"Go name of the field", rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("OptI64")}, "AllKinds has no such field"},
		{"repeated", rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("list")}, "repeated"},
		{"map", rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("by_name")}, "map"},
		{"message", rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("user")}, "message fields do not convert"},
		{"string to int64", rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("str")}, "string fields do not convert"},
		{"uint64 to int64", rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("u64")}, "uint64 fields do not convert"},
		{"bool", rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("flag")}, "bool fields"},
		{"double", rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("real")}, "double fields"},
		{"enum", rpcguard.Keys[int64]{kinds: rpcguard.Field[int64]("color")}, "enum fields"},
		{"func of another message", rpcguard.Keys[int64]{getUser: rpcguard.Func(func(m *testpb.AllKinds) (int64, bool) { return 0, false })}, "the method's request is rpcguard.test.v1.GetUserRequest"},
		{"nil func", rpcguard.Keys[int64]{getUser: rpcguard.Func[*testpb.GetUserRequest, int64](nil)}, "nil key function"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ic, err := rpcguard.New[int64](f, tc.keys)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, %v; want an error with %q", ic, err, tc.want)
			}
			t.Log(err)
		})
	}
	narrow := []struct {
		name string
		err  error
		want string
	}{
		{"int64 to int32", newErr(rpcguard.Field[int32]("i64")), "int64 fields do not convert to key type int32"},
		{"uint64 to uint32", newErr(rpcguard.Field[uint32]("u64")), "uint64 fields do not convert to key type uint32"},
		{"int32 to uint64", newErr(rpcguard.Field[uint64]("i32")), "int32 fields do not convert"},
		{"key type Field does not take", newErr(rpcguard.Field[float64]("real")), "use Func"},
	}
	for _, tc := range narrow {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, tc.err, tc.want)
		}
	}
	if _, err := rpcguard.New[int64](nil, rpcguard.Keys[int64]{getUser: rpcguard.Field[int64]("id")}); err == nil {
		t.Error("nil filter: no error")
	}
	var nilFilter *recordFilter[int64]
	if _, err := rpcguard.New[int64](nilFilter, rpcguard.Keys[int64]{getUser: rpcguard.Field[int64]("id")}); err == nil {
		t.Error("nil pointer filter: no error")
	}
	if _, err := rpcguard.New[int64](f, rpcguard.Keys[int64]{getUser: rpcguard.Field[int64]("id")}, nil); err == nil {
		t.Error("nil option: no error")
	}
	// A Func of an interface type takes any request: nothing to check.
	if _, err := rpcguard.New[int64](f, rpcguard.Keys[int64]{getUser: rpcguard.Func(func(m proto.Message) (int64, bool) { return 0, false })}); err != nil {
		t.Errorf("Func of proto.Message: %v", err)
	}
}

// newErr returns New's error for the Kinds method guarded with key.
func newErr[K comparable](key rpcguard.Key[K]) error {
	var keys []K
	_, err := rpcguard.New[K](recordFilter[K]{&keys}, rpcguard.Keys[K]{kinds: key})
	return err
}
