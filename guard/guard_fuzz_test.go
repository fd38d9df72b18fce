package guard

import (
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzOps decodes an operation stream from bytes and runs it against a
// guard and a plain-map model. The first 8 bytes seed the guard; then each
// operation is one byte: op%4 picks add, add-copy, remove or lookup, and
// for add the next byte gives a key length (0..15) followed by the key.
// No added key may ever read absent and Len must match the model.
func FuzzOps(f *testing.F) {
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03abc\x01\x02\x03"))
	f.Add([]byte("seedseed\x00\x00\x00\x00\x01\x01\x01\x01\x01\x01\x01\x01\x01\x02\x03"))
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 8 {
			return
		}
		g, err := New(WithCapacity(16), WithSeed(binary.LittleEndian.Uint64(data)))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		data = data[8:]
		model := map[string]int{}
		var keys []string
		total := 0
		for len(data) > 0 {
			op := data[0]
			data = data[1:]
			switch op % 4 {
			case 0: // add a key read from the stream
				if len(data) == 0 {
					break
				}
				n := min(int(data[0]%16), len(data)-1)
				k := string(data[1 : 1+n])
				data = data[1+n:]
				if err := g.AddString(k); err != nil {
					if refused(t, g, k, model[k], err) {
						break
					}
					t.Fatalf("AddString(%q): %v", k, err)
				}
				if model[k] == 0 {
					keys = append(keys, k)
				}
				model[k]++
				total++
			case 1: // add another copy of a known key
				if len(keys) == 0 {
					break
				}
				k := keys[int(op/4)%len(keys)]
				if err := g.Add([]byte(k)); err != nil {
					if refused(t, g, k, model[k], err) {
						break
					}
					t.Fatalf("Add(%q): %v", k, err)
				}
				model[k]++
				total++
			case 2: // remove a known key
				if len(keys) == 0 {
					break
				}
				i := int(op/4) % len(keys)
				k := keys[i]
				if !g.RemoveString(k) {
					t.Fatalf("RemoveString(%q) = false for an added key", k)
				}
				total--
				if model[k]--; model[k] == 0 {
					delete(model, k)
					keys[i] = keys[len(keys)-1]
					keys = keys[:len(keys)-1]
				}
			case 3: // look up every known key
				for _, k := range keys {
					if !g.ContainsString(k) {
						t.Fatalf("false negative for %q", k)
					}
				}
			}
		}
		for k := range model {
			if !g.Contains([]byte(k)) {
				t.Fatalf("false negative for %q at the end", k)
			}
		}
		if g.Len() != total {
			t.Fatalf("Len() = %d, want %d", g.Len(), total)
		}
	})
}

// refused reports whether err is a refusal the guard may give for an add
// of key k, which the model holds n times: ErrFull, or ErrTooManyCopies
// for a key that reads present (n copies of it, or of another key with the
// same slot).
func refused(t *testing.T, g *Guard, k string, n int, err error) bool {
	t.Helper()
	switch {
	case errors.Is(err, ErrFull):
		return true
	case errors.Is(err, ErrTooManyCopies):
		if !g.ContainsString(k) {
			t.Fatalf("Add(%q) = ErrTooManyCopies for a key that reads absent", k)
		}
		return true
	}
	return false
}
