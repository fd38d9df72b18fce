package rpcguard

import (
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Key says how an [Interceptor] takes the key from the request message of
// a method. Make one with [Field] or [Func]; the zero Key is refused by
// [New].
type Key[K comparable] struct {
	desc string // for errors: `field "id"`, "func(*usersv1.GetUserRequest)"
	// bind checks the Key against the method's request type and returns
	// the function that takes the key from a request.
	bind func(in protoreflect.MessageDescriptor) (extractor[K], error)
}

// extractor returns the key of a request message, and whether the request
// has a well-formed one. It never modifies the request.
type extractor[K comparable] func(req any) (K, bool)

// Field takes the key from the request's field of the given protobuf name,
// as the .proto file spells it ("user_id", not "UserId"). [New] checks it
// against each method's request type, through the method's descriptor: the
// field must exist, must not be repeated or a map, and must be of a kind
// that converts to K without loss:
//
//	K        field kinds
//	int64    int64, sint64, sfixed64, int32, sint32, sfixed32
//	int32    int32, sint32, sfixed32
//	uint64   uint64, fixed64, uint32, fixed32
//	uint32   uint32, fixed32
//	string   string, bytes
//
// A bytes field gives a string key of its bytes as they are; for the key
// of a bytea column, whose guard holds keys as text (\x and hex), use
// [Bytea]. For other key types (a named type of the Loader, a key made of
// several fields, a field of a nested message), use [Func].
//
// A field that is not set is a missing key: the request passes. A proto3
// field without presence (declared without optional) counts as not set
// when it holds its zero value, so a request for id 0 or "" always passes;
// declare the field optional, or use Func, if 0 or "" is a key. A member of
// a oneof is set when the oneof holds it.
func Field[K comparable](name string) Key[K] {
	return Key[K]{desc: fmt.Sprintf("field %q", name), bind: func(in protoreflect.MessageDescriptor) (extractor[K], error) {
		fd := in.Fields().ByName(protoreflect.Name(name))
		switch {
		case fd == nil:
			return nil, fmt.Errorf("%s has no such field (fields go by their protobuf names, as in the .proto file)", in.FullName())
		case fd.IsMap():
			return nil, fmt.Errorf("a map in %s, not one key", in.FullName())
		case fd.IsList():
			return nil, fmt.Errorf("repeated in %s, not one key", in.FullName())
		}
		conv, err := converter[K](fd)
		if err != nil {
			return nil, fmt.Errorf("in %s: %w", in.FullName(), err)
		}
		return fieldExtractor(in, fd, conv), nil
	}}
}

// Bytea takes the key of a bytea column from the request's bytes field of
// the given protobuf name: the field's bytes as the text in which the
// database prints them, and the postgres followers hold them ("\x" and
// lower-case hex: the bytes 0x01 0xff are `\x01ff`). [Field] would give
// the raw bytes, which are not that text: every lookup of a present key
// would read absent. [New] checks that the field is a single bytes field.
func Bytea(name string) Key[string] {
	return Key[string]{desc: fmt.Sprintf("bytea field %q", name), bind: func(in protoreflect.MessageDescriptor) (extractor[string], error) {
		fd := in.Fields().ByName(protoreflect.Name(name))
		switch {
		case fd == nil:
			return nil, fmt.Errorf("%s has no such field (fields go by their protobuf names, as in the .proto file)", in.FullName())
		case fd.IsMap() || fd.IsList():
			return nil, fmt.Errorf("repeated or a map in %s, not one key", in.FullName())
		case fd.Kind() != protoreflect.BytesKind:
			return nil, fmt.Errorf("a %s field in %s: Bytea takes a bytes field", fd.Kind(), in.FullName())
		}
		return fieldExtractor(in, fd, func(v protoreflect.Value) string {
			b := v.Bytes()
			out := make([]byte, 2+hex.EncodedLen(len(b)))
			out[0], out[1] = '\\', 'x'
			hex.Encode(out[2:], b)
			return string(out)
		}), nil
	}}
}

// fieldExtractor returns the extractor of field fd of message in.
func fieldExtractor[K comparable](in protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor, conv func(protoreflect.Value) K) extractor[K] {
	return func(req any) (K, bool) {
		var zero K
		pm, ok := req.(proto.Message)
		if !ok {
			return zero, false
		}
		m := pm.ProtoReflect()
		f := fd
		if d := m.Descriptor(); d != in {
			// The same message through another descriptor (a dynamic
			// message, or a type from another registry): the field of
			// that descriptor, if it is the same field. Get would panic
			// with a field of another descriptor.
			if d.FullName() != in.FullName() {
				return zero, false
			}
			f = d.Fields().ByName(fd.Name())
			if f == nil || f.Kind() != fd.Kind() || f.IsList() || f.IsMap() {
				return zero, false
			}
		}
		if !m.Has(f) {
			return zero, false
		}
		return conv(m.Get(f)), true
	}
}

// converter returns the function that turns a value of field fd into a
// key of type K, or an error if fd's kind does not convert to K without
// loss.
func converter[K comparable](fd protoreflect.FieldDescriptor) (func(protoreflect.Value) K, error) {
	var (
		zero K
		conv any // a func(protoreflect.Value) K, made for K's type
	)
	switch kind := fd.Kind(); any(zero).(type) {
	case int64:
		if signed32(kind) || signed64(kind) {
			conv = func(v protoreflect.Value) int64 { return v.Int() }
		}
	case int32:
		if signed32(kind) {
			conv = func(v protoreflect.Value) int32 { return int32(v.Int()) }
		}
	case uint64:
		if unsigned32(kind) || unsigned64(kind) {
			conv = func(v protoreflect.Value) uint64 { return v.Uint() }
		}
	case uint32:
		if unsigned32(kind) {
			conv = func(v protoreflect.Value) uint32 { return uint32(v.Uint()) }
		}
	case string:
		switch kind {
		case protoreflect.StringKind:
			conv = func(v protoreflect.Value) string { return v.String() }
		case protoreflect.BytesKind:
			conv = func(v protoreflect.Value) string { return string(v.Bytes()) }
		}
	default:
		return nil, fmt.Errorf("key type %s: Field converts to int64, int32, uint64, uint32 and string keys; use Func", reflect.TypeFor[K]())
	}
	if conv == nil {
		return nil, fmt.Errorf("%s fields do not convert to key type %s without loss", fd.Kind(), reflect.TypeFor[K]())
	}
	return conv.(func(protoreflect.Value) K), nil
}

func signed32(k protoreflect.Kind) bool {
	return k == protoreflect.Int32Kind || k == protoreflect.Sint32Kind || k == protoreflect.Sfixed32Kind
}

func signed64(k protoreflect.Kind) bool {
	return k == protoreflect.Int64Kind || k == protoreflect.Sint64Kind || k == protoreflect.Sfixed64Kind
}

func unsigned32(k protoreflect.Kind) bool {
	return k == protoreflect.Uint32Kind || k == protoreflect.Fixed32Kind
}

func unsigned64(k protoreflect.Kind) bool {
	return k == protoreflect.Uint64Kind || k == protoreflect.Fixed64Kind
}

// Func takes the key with f, a function of the request message that
// returns the key and whether the request has a well-formed one; a request
// without one passes. f must not modify the request, and must be safe for
// concurrent use: it runs on every request of the method, before the
// handler.
//
// [New] checks that M is the method's request type. With M an interface
// type, such as [proto.Message], f takes the request of any method whose
// message implements it, and New checks nothing.
//
//	rpcguard.Func(func(r *usersv1.GetUserRequest) (int64, bool) { return r.GetUser().GetId(), r.GetUser() != nil })
func Func[M proto.Message, K comparable](f func(req M) (K, bool)) Key[K] {
	typ := reflect.TypeFor[M]()
	return Key[K]{desc: "func(" + typ.String() + ")", bind: func(in protoreflect.MessageDescriptor) (extractor[K], error) {
		if f == nil {
			return nil, errors.New("nil key function")
		}
		if typ.Kind() != reflect.Interface {
			name, err := messageName[M]()
			if err != nil {
				return nil, err
			}
			if name != in.FullName() {
				return nil, fmt.Errorf("the key function takes %s (%s), the method's request is %s", typ, name, in.FullName())
			}
		}
		return func(req any) (K, bool) {
			m, ok := req.(M)
			if !ok {
				var zero K
				return zero, false
			}
			return f(m)
		}, nil
	}}
}

// messageName returns the full protobuf name of message type M, a pointer
// to a generated message struct.
func messageName[M proto.Message]() (name protoreflect.FullName, err error) {
	defer func() {
		// A message type whose ProtoReflect does not take a nil
		// receiver, as generated code does.
		if recover() != nil {
			err = fmt.Errorf("cannot tell the protobuf message of %s from a nil value", reflect.TypeFor[M]())
		}
	}()
	var zero M
	return zero.ProtoReflect().Descriptor().FullName(), nil
}
