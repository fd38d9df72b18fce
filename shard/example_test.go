package shard_test

import (
	"errors"
	"fmt"

	"github.com/cuckooguard/cuckooguard/shard"
)

func ExampleShard() {
	// A shard of 2^4 buckets (64 slots). Callers derive a nonzero 8-bit
	// fingerprint and a position (the top 40 bits of v) from their own hash
	// of the key.
	s, err := shard.New(4)
	if err != nil {
		panic(err)
	}
	const f, v = 0x5a, 0x12345678 << 32
	if err := s.Insert(f, v); err != nil {
		panic(err)
	}
	fmt.Println(s.Contains(f, v), s.Len())
	fmt.Println(s.Delete(f, v), s.Contains(f, v))
	// Output:
	// true 1
	// true false
}

func ExampleShard_Grow() {
	s, err := shard.New(1)
	if err != nil {
		panic(err)
	}
	// Insert, doubling whenever the table is full.
	for i := range uint64(100) {
		for {
			err := s.Insert(uint8(i%255+1), i*0x9e3779b97f4a7c15)
			if !errors.Is(err, shard.ErrFull) {
				break
			}
			if err := s.Grow(); err != nil {
				panic(err)
			}
		}
	}
	st := s.Stats()
	fmt.Println(st.Items, st.Doublings > 0, st.Tails[shard.MaxTailBits] > 0)
	// Output: 100 true true
}
