package guarded

import (
	"context"
	"fmt"
	"iter"
	"reflect"
)

// Getter looks a key up in the store a [Loader] guards: it returns the
// key's value, or an error that [WithNotFound] recognizes (by default
// [ErrNotFound] and [sql.ErrNoRows]) if the store has no such key.
//
// A Getter may offer more: a [BatchGetter] lets [Loader.GetMany] look up
// many keys in one call, and a [KeyLister] lets the Loader rebuild its
// guard from every key of the store. [Funcs] offers all three from
// functions; a type of your own offers them as methods (check it with
// var _ guarded.KeyLister[K, V] = (*T)(nil)).
//
// A Loader calls Get from many goroutines at once (one per lookup that
// reaches the store, and up to [WithFillWorkers] during a fill), so Get
// must be safe for concurrent use, as a *sql.DB or a pgxpool.Pool is. It
// should return when ctx is done.
type Getter[K comparable, V any] interface {
	Get(ctx context.Context, key K) (V, error)
}

// GetterFunc adapts a function to a [Getter].
type GetterFunc[K comparable, V any] func(ctx context.Context, key K) (V, error)

// Get calls f(ctx, key).
func (f GetterFunc[K, V]) Get(ctx context.Context, key K) (V, error) { return f(ctx, key) }

// BatchGetter is a [Getter] that can also look up many keys in one call,
// for example with one SELECT … WHERE id = ANY($1). GetMany returns the
// values it found, by key: a key missing from the map is not in the store,
// and an error fails every key of the call.
type BatchGetter[K comparable, V any] interface {
	Getter[K, V]
	GetMany(ctx context.Context, keys []K) (map[K]V, error)
}

// KeyLister is a [Getter] that can also list every key of the store, for
// example with SELECT id FROM users. A Loader whose Getter is a KeyLister
// rebuilds its guard from it when a shard cannot take a key ([guard.ErrFull])
// or the false-positive rate passes [WithMaxFPR]; without one such a
// shard passes its lookups through for good.
type KeyLister[K comparable, V any] interface {
	Getter[K, V]
	Keys(ctx context.Context) iter.Seq2[K, error]
}

// Funcs is a [Getter] made of functions: Lookup is required; LookupMany
// and ListKeys are optional and do what [BatchGetter.GetMany] and
// [KeyLister.Keys] do. The fields' types follow from K and V, so a
// function of the wrong key or value type does not compile:
//
//	users, err := guarded.New(g, guarded.Funcs[int64, User]{
//		Lookup:     db.Lookup,     // SELECT … WHERE id = $1
//		LookupMany: db.LookupMany, // SELECT … WHERE id = ANY($1)
//		ListKeys:   db.IDs,        // SELECT id FROM users
//	})
type Funcs[K comparable, V any] struct {
	Lookup     func(ctx context.Context, key K) (V, error)
	LookupMany func(ctx context.Context, keys []K) (map[K]V, error)
	ListKeys   func(ctx context.Context) iter.Seq2[K, error]
}

// Get calls f.Lookup.
func (f Funcs[K, V]) Get(ctx context.Context, key K) (V, error) { return f.Lookup(ctx, key) }

// source is what a Loader reads from its store.
type source[K comparable, V any] struct {
	get  func(ctx context.Context, key K) (V, error)
	many func(ctx context.Context, keys []K) (map[K]V, error) // nil: one Get per key
	keys func(ctx context.Context) iter.Seq2[K, error]        // nil: no rebuilds
}

// sourceOf finds what store offers. A store type with a GetMany or Keys
// method of the wrong signature is an error, not a silently unused method.
func sourceOf[K comparable, V any](store Getter[K, V]) (source[K, V], error) {
	switch s := store.(type) {
	case nil:
		return source[K, V]{}, errNoStore
	case Funcs[K, V]:
		return funcsSource(s)
	case *Funcs[K, V]:
		if s == nil {
			return source[K, V]{}, errNoStore
		}
		return funcsSource(*s)
	case GetterFunc[K, V]:
		if s == nil {
			return source[K, V]{}, errNoStore
		}
	}
	src := source[K, V]{get: store.Get}
	if b, ok := store.(BatchGetter[K, V]); ok {
		src.many = b.GetMany
	} else if err := wrongMethod[BatchGetter[K, V]](store, "GetMany"); err != nil {
		return src, err
	}
	if kl, ok := store.(KeyLister[K, V]); ok {
		src.keys = kl.Keys
	} else if err := wrongMethod[KeyLister[K, V]](store, "Keys"); err != nil {
		return src, err
	}
	return src, nil
}

func funcsSource[K comparable, V any](f Funcs[K, V]) (source[K, V], error) {
	if f.Lookup == nil {
		return source[K, V]{}, fmt.Errorf("guarded: Funcs needs a Lookup function")
	}
	return source[K, V]{get: f.Lookup, many: f.LookupMany, keys: f.ListKeys}, nil
}

// wrongMethod returns an error if store has a method called name that is
// not the method of interface I.
func wrongMethod[I any](store any, name string) error {
	m := reflect.ValueOf(store).MethodByName(name)
	if !m.IsValid() {
		return nil
	}
	want, _ := reflect.TypeFor[I]().MethodByName(name)
	return fmt.Errorf("guarded: the store's %s method is %v, not %v: the Loader would not use it", name, m.Type(), want.Type)
}
