package guarded

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"unsafe"

	"github.com/cuckooguard/cuckooguard/guard"
)

// Key is implemented by key types that a Loader cannot hash by
// themselves. Keys whose underlying type is a string, an integer or a byte
// array need nothing: strings hash as their bytes, integers as their
// 8-byte little-endian value (sign-extended), byte arrays as their bytes.
// Any other key type, such as a struct, must implement Key: AppendKey
// appends the key's bytes to b and returns the result, and two keys must
// append equal bytes exactly when they are equal. A key type that
// implements Key is hashed by it, whatever its underlying type.
type Key interface {
	AppendKey(b []byte) []byte
}

// keyCodec turns keys of type K into the guard's hash.
type keyCodec[K comparable] struct {
	hash func(g *guard.Guard, k K) uint64
}

// newKeyCodec returns the codec for K (see [Key]).
func newKeyCodec[K comparable]() (keyCodec[K], error) {
	if reflect.TypeFor[K]().Implements(reflect.TypeFor[Key]()) {
		return keyCodec[K]{
			hash: func(g *guard.Guard, k K) uint64 {
				var buf [64]byte
				return g.Hash(any(k).(Key).AppendKey(buf[:0]))
			},
		}, nil
	}
	t := reflect.TypeFor[K]()
	switch t.Kind() {
	case reflect.String:
		return keyCodec[K]{
			hash: func(g *guard.Guard, k K) uint64 { return g.HashString(*(*string)(unsafe.Pointer(&k))) },
		}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return keyCodec[K]{
			hash: func(g *guard.Guard, k K) uint64 { return hashUint64(g, uint64(signed(&k))) },
		}, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return keyCodec[K]{
			hash: func(g *guard.Guard, k K) uint64 { return hashUint64(g, unsigned(&k)) },
		}, nil
	case reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return keyCodec[K]{
				hash: func(g *guard.Guard, k K) uint64 { return g.Hash(arrayBytes(&k)) },
			}, nil
		}
	}
	return keyCodec[K]{}, fmt.Errorf("guarded: keys of type %v must implement guarded.Key (AppendKey): the Loader cannot hash them by themselves", t)
}

// hashUint64 hashes an integer key as its 8-byte little-endian encoding.
func hashUint64(g *guard.Guard, x uint64) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], x)
	return g.Hash(b[:])
}

// signed reads the integer that *k holds, for K of a signed integer kind.
func signed[K any](k *K) int64 {
	p := unsafe.Pointer(k)
	switch unsafe.Sizeof(*k) {
	case 1:
		return int64(*(*int8)(p))
	case 2:
		return int64(*(*int16)(p))
	case 4:
		return int64(*(*int32)(p))
	default:
		return *(*int64)(p)
	}
}

// unsigned reads the integer that *k holds, for K of an unsigned kind.
func unsigned[K any](k *K) uint64 {
	p := unsafe.Pointer(k)
	switch unsafe.Sizeof(*k) {
	case 1:
		return uint64(*(*uint8)(p))
	case 2:
		return uint64(*(*uint16)(p))
	case 4:
		return uint64(*(*uint32)(p))
	default:
		return *(*uint64)(p)
	}
}

// arrayBytes returns the bytes of *k, for K of a byte-array kind.
func arrayBytes[K any](k *K) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(k)), unsafe.Sizeof(*k))
}
