package guard_test

import (
	"errors"
	"fmt"

	"github.com/cuckooguard/cuckooguard/guard"
)

func Example() {
	g, err := guard.New(guard.WithCapacity(100_000))
	if err != nil {
		panic(err)
	}
	defer g.Close()

	for _, id := range []string{"user:1", "user:2", "user:3"} {
		if err := g.AddString(id); err != nil {
			panic(err)
		}
	}
	for _, id := range []string{"user:2", "user:999"} {
		if !g.ContainsString(id) {
			fmt.Println(id, "definitely absent: skip the database")
			continue
		}
		fmt.Println(id, "maybe present: ask the database")
	}
	// Output:
	// user:2 maybe present: ask the database
	// user:999 definitely absent: skip the database
}

func ExampleNew() {
	// Expect about a million keys; fix the seed so that several processes
	// (or a restored snapshot) route keys the same way.
	g, err := guard.New(guard.WithCapacity(1_000_000), guard.WithSeed(42))
	if err != nil {
		panic(err)
	}
	defer g.Close()
	st := g.Stats()
	fmt.Println(st.Shards > 0, st.Items, st.BitsPerItem)

	// Invalid options are errors, never panics.
	_, err = guard.New(guard.WithShards(0))
	fmt.Println(err)
	// Output:
	// true 0 0
	// guard: shard count 0 out of range [1, 65536]
}

func ExampleGuard_Add() {
	g, err := guard.New()
	if err != nil {
		panic(err)
	}
	defer g.Close()

	if err := g.Add([]byte("order:17")); errors.Is(err, guard.ErrFull) {
		// The key's shard is saturated: treat its lookups as "maybe" and
		// rebuild the guard from the store.
		fmt.Println("full")
	}
	fmt.Println(g.Contains([]byte("order:17")), g.Len())
	// Output: true 1
}

func ExampleGuard_Remove() {
	g, err := guard.New()
	if err != nil {
		panic(err)
	}
	defer g.Close()

	_ = g.AddString("session:a")
	// Remove only keys you added (for example, after the store confirmed
	// that it deleted the row): removing a key that was never added can
	// remove a different key that shares its fingerprint.
	fmt.Println(g.RemoveString("session:a"), g.ContainsString("session:a"))
	// Output: true false
}

func ExampleGuard_Stats() {
	g, err := guard.New(guard.WithCapacity(10_000), guard.WithSeed(1))
	if err != nil {
		panic(err)
	}
	defer g.Close()
	for i := range 10_000 {
		_ = g.AddString(fmt.Sprint("key-", i))
	}
	st := g.Stats()
	fmt.Printf("items=%d doublings=%d bits/item<=21:%v fpr<1e-3:%v\n",
		st.Items, st.Doublings, st.BitsPerItem <= 21, st.EstimatedFPR < 1e-3)
	// Output: items=10000 doublings=0 bits/item<=21:true fpr<1e-3:true
}

func ExampleGuard_ContainsHash() {
	g, err := guard.New()
	if err != nil {
		panic(err)
	}
	defer g.Close()
	// Callers that already hash their keys (with a well-mixed 64-bit hash)
	// can skip the guard's own hashing.
	h := g.HashString("precomputed")
	_ = g.AddHash(h)
	fmt.Println(g.ContainsHash(h), g.ContainsString("precomputed"))
	// Output: true true
}
