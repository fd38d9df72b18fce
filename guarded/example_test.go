package guarded_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// The compiler checks that users offers what the Loader uses.
var _ guarded.KeyLister[int64, string] = (*users)(nil)

// users is a stand-in for a database table.
type users struct {
	mu   sync.Mutex
	rows map[int64]string
}

// Get makes users a guarded.Getter: it looks one row up.
func (u *users) Get(ctx context.Context, id int64) (string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	name, ok := u.rows[id]
	if !ok {
		return "", guarded.ErrNotFound // or sql.ErrNoRows: see WithNotFound
	}
	return name, nil
}

// Keys makes users a guarded.KeyLister: the Loader rebuilds its guard
// from it when needed.
func (u *users) Keys(ctx context.Context) iter.Seq2[int64, error] {
	return func(yield func(int64, error) bool) {
		u.mu.Lock()
		defer u.mu.Unlock()
		for id := range u.rows {
			if !yield(id, nil) {
				return
			}
		}
	}
}

func ExampleLoader() {
	ctx := context.Background()
	db := &users{rows: map[int64]string{1: "Ada", 2: "Grace"}}

	g, err := guard.New(guard.WithCapacity(1_000_000))
	if err != nil {
		panic(err)
	}
	// The Loader owns g and closes it.
	loader, err := guarded.New(g, db)
	if err != nil {
		panic(err)
	}
	defer loader.Close()

	// Warm up: until Fill returns, every lookup reaches the store.
	if err := loader.Fill(ctx, db.Keys(ctx)); err != nil {
		panic(err)
	}

	// Writes go through the Loader, around the store's own write.
	err = loader.Insert(ctx, 3, func(ctx context.Context) error {
		db.mu.Lock()
		defer db.mu.Unlock()
		db.rows[3] = "Edsger"
		return nil
	})
	if err != nil {
		panic(err)
	}
	err = loader.Delete(ctx, 2, func(ctx context.Context) (bool, error) {
		db.mu.Lock()
		defer db.mu.Unlock()
		_, existed := db.rows[2]
		delete(db.rows, 2)
		return existed, nil
	})
	if err != nil {
		panic(err)
	}

	for _, id := range []int64{1, 2, 3, 42} {
		name, err := loader.Get(ctx, id)
		switch {
		case errors.Is(err, guarded.ErrNotFound):
			fmt.Println(id, "not found")
		case err != nil:
			panic(err)
		default:
			fmt.Println(id, name)
		}
	}
	// Output:
	// 1 Ada
	// 2 not found
	// 3 Edsger
	// 42 not found
}

// Funcs makes a store of plain functions; with LookupMany, GetMany asks
// the store once for all the ids the guard lets through.
func ExampleFuncs() {
	ctx := context.Background()
	rows := map[int64]string{1: "Ada", 2: "Grace", 3: "Edsger"}

	g, err := guard.New(guard.WithCapacity(1000))
	if err != nil {
		panic(err)
	}
	loader, err := guarded.New(g, guarded.Funcs[int64, string]{
		Lookup: func(ctx context.Context, id int64) (string, error) { // SELECT … WHERE id = $1
			if name, ok := rows[id]; ok {
				return name, nil
			}
			return "", guarded.ErrNotFound
		},
		LookupMany: func(ctx context.Context, ids []int64) (map[int64]string, error) { // … WHERE id = ANY($1)
			found := make(map[int64]string, len(ids))
			for _, id := range ids {
				if name, ok := rows[id]; ok {
					found[id] = name
				}
			}
			return found, nil
		},
	})
	if err != nil {
		panic(err)
	}
	defer loader.Close()
	// Warm up from the table's ids (SELECT id FROM users).
	ids := func(yield func(int64, error) bool) {
		for id := range rows {
			if !yield(id, nil) {
				return
			}
		}
	}
	if err := loader.Fill(ctx, ids); err != nil {
		panic(err)
	}

	asked := []int64{1, 3, 1000, 1001, 1002}
	names, errs := loader.GetMany(ctx, asked)
	for i, id := range asked {
		if errors.Is(errs[i], guarded.ErrNotFound) {
			fmt.Println(id, "not found")
			continue
		}
		fmt.Println(id, names[i])
	}
	fmt.Println("store calls:", loader.Stats().StoreCalls)
	// Output:
	// 1 Ada
	// 3 Edsger
	// 1000 not found
	// 1001 not found
	// 1002 not found
	// store calls: 1
}
