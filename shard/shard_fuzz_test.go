package shard

import (
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzOps decodes an operation stream for a shard of 2 buckets: each
// operation is a byte op and, for inserts, 5 more bytes (fingerprint and
// the first 32 bits of the position). op%5 picks insert, insert-copy, delete, lookup or
// grow. Every inserted item must read present until deleted, and Len must
// match the model.
func FuzzOps(f *testing.F) {
	f.Add([]byte("\x00\x01\x00\x00\x00\x00\x00\x02\x00\x00\x00\x01\x04\x03\x02"))
	f.Add([]byte("\x00\xff\xff\xff\xff\xff\x01\x01\x01\x01\x01\x01\x01\x01\x01\x04\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := New(1)
		if err != nil {
			t.Fatal(err)
		}
		model := map[item]int{}
		var items []item
		total := 0
		insert := func(it item) {
			err := s.Insert(it.f, it.v)
			if errors.Is(err, ErrFull) || errors.Is(err, ErrTooManyCopies) {
				return
			}
			if err != nil {
				t.Fatalf("Insert(%+v): %v", it, err)
			}
			if model[it] == 0 {
				items = append(items, it)
			}
			model[it]++
			total++
		}
		for len(data) > 0 {
			op := data[0]
			data = data[1:]
			switch op % 5 {
			case 0:
				if len(data) < 5 {
					return
				}
				it := item{f: data[0]%255 + 1, v: uint64(binary.LittleEndian.Uint32(data[1:])) << 32}
				data = data[5:]
				insert(it)
			case 1:
				if len(items) > 0 {
					insert(items[int(op/5)%len(items)])
				}
			case 2:
				if len(items) == 0 {
					break
				}
				i := int(op/5) % len(items)
				it := items[i]
				if !s.Delete(it.f, it.v) {
					t.Fatalf("Delete(%+v) = false for an inserted item", it)
				}
				total--
				if model[it]--; model[it] == 0 {
					delete(model, it)
					items[i] = items[len(items)-1]
					items = items[:len(items)-1]
				}
			case 3:
				for _, it := range items {
					if !s.Contains(it.f, it.v) {
						t.Fatalf("false negative for %+v", it)
					}
				}
			case 4:
				// Every doubling doubles the memory: stop at 2^16 buckets.
				if s.Stats().Buckets < 1<<16 {
					if err := s.Grow(); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		for _, it := range items {
			if !s.Contains(it.f, it.v) {
				t.Fatalf("false negative for %+v at the end", it)
			}
		}
		if s.Len() != total {
			t.Fatalf("Len() = %d, want %d", s.Len(), total)
		}
	})
}
