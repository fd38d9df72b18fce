package postgres

import (
	"bytes"
	"maps"
	"strconv"
	"testing"

	"github.com/cuckooguard/cuckooguard/internal/tagrec"
)

// FuzzSplitTag splits tags of fuzzed keys, and fuzzed bytes, under fuzzed
// sizes: the pieces are the tag cut at record boundaries, each within the
// size unless it is one record (or the unreadable tail), and they name the
// keys the whole tag names.
func FuzzSplitTag(f *testing.F) {
	f.Add([]byte("a\x00bb\x00ccc"), uint16(10), false)
	f.Add([]byte("1:x"), uint16(3), true)
	f.Add([]byte("12:abc"), uint16(1), true)
	f.Add([]byte(""), uint16(0), false)
	tagger, err := newTagger("origin", func(s string) (string, error) { return s, nil }, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte, size uint16, raw bool) {
		tag := b
		if !raw {
			var keys []string
			for _, k := range bytes.Split(b, []byte{0}) {
				keys = append(keys, string(k))
			}
			if tag, err = tagger.Content("test", keys...); err != nil {
				t.Skip()
			}
		}
		pieces := tagrec.Split(tag, int(size))
		if got := bytes.Join(pieces, nil); !bytes.Equal(got, tag) {
			t.Fatalf("pieces %q join to %q, want %q", pieces, got, tag)
		}
		for i, p := range pieces {
			if len(p) > int(size) && len(pieces) > 1 {
				if _, after, ok := tagrec.CutField(string(p)); ok {
					if _, after, ok = tagrec.CutField(after); ok && after != "" {
						t.Errorf("piece %d of %d: %d bytes, over %d, and more than one record: %q", i, len(pieces), len(p), size, p)
					}
				}
			}
		}
		if want, got := tagger.Own([][]byte{tag}), tagger.Own(pieces); !maps.Equal(want, got) {
			t.Errorf("the pieces name %v, the tag %v", got, want)
		}
	})
}

func TestSplitTag(t *testing.T) {
	tagger, err := newTagger("o", func(s string) (string, error) { return s, nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := range 30000 {
		keys = append(keys, strconv.Itoa(i))
	}
	tag, err := tagger.Content("test", keys...)
	if err != nil {
		t.Fatal(err)
	}
	pieces := tagrec.Split(tag, 64<<10)
	if len(pieces) < len(tag)/(64<<10) {
		t.Fatalf("%d bytes in %d pieces of at most 64 KiB", len(tag), len(pieces))
	}
	if own := tagger.Own(pieces); len(own) != len(keys) {
		t.Errorf("the pieces name %d keys, want %d", len(own), len(keys))
	}
}
