package fanout

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/cuckooguard/cuckooguard/follow"
)

// TestToken checks that a table's token is a valid NATS subject token
// (letters, digits, "_" and "-"), bounded in length, and that names that
// differ only in what the token replaces still get different tokens.
func TestToken(t *testing.T) {
	cases := []string{"public.users", "Public.Users", "public.users ", "public.us.ers", "a.b", "a_b", "x." + strings.Repeat("é", 100), "", "s.t*>"}
	seen := map[string]string{}
	for _, table := range cases {
		tok := Token(table)
		checkToken(t, table, tok)
		if prev, dup := seen[tok]; dup {
			t.Errorf("Token(%q) = Token(%q) = %q", table, prev, tok)
		}
		seen[tok] = table
		if again := Token(table); again != tok {
			t.Errorf("Token(%q) = %q, then %q", table, tok, again)
		}
	}
}

func checkToken(t *testing.T, table, tok string) {
	t.Helper()
	if len(tok) == 0 || len(tok) > 64+9 {
		t.Errorf("Token(%q) = %q: %d bytes", table, tok, len(tok))
	}
	for _, r := range tok {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			t.Errorf("Token(%q) = %q holds %q, which a subject token must not", table, tok, r)
		}
	}
}

// TestSplit checks split on a transaction that fits, on one that takes
// several parts, on keys that JSON escapes, and on a key too big for any
// part.
func TestSplit(t *testing.T) {
	m := txMsg{Epoch: "e1", DB: "1_5", Term: 7, LSN: 900, Prev: 800, Xid: 7, Tok: 41, Version: "v3", Reread: true, Tags: [][]byte{[]byte("tag")},
		Creates: []string{"a", "bb", "ccc"}, Deletes: []string{"dddd"}}
	if parts := split(m, 1<<20); len(parts) != 1 || !reflect.DeepEqual(parts[0], m) {
		t.Errorf("split under the limit = %+v, want the message as it is", parts)
	}
	m.Reread = false
	limit := encodedLen(t, txMsg{Epoch: m.Epoch, DB: m.DB, Term: m.Term, LSN: m.LSN, Prev: m.Prev, Xid: m.Xid, Tok: m.Tok, Version: m.Version,
		Part: 1 << 30, Parts: 1 << 30, Reread: true, Creates: []string{""}, Deletes: []string{""}, Tags: [][]byte{{}}}) + 12
	parts := split(m, limit)
	checkSplit(t, m, limit, parts)
	if len(parts) < 3 {
		t.Errorf("split into %d parts, want at least 3: %+v", len(parts), parts)
	}
	// 6,000 keys of "<<<<<<": 56 bytes each once escaped, not 10.
	esc := txMsg{Epoch: "e", DB: "1_5", LSN: 2, Prev: 1}
	for range 6000 {
		esc.Creates = append(esc.Creates, "<<<<<<")
	}
	checkSplit(t, esc, 64<<10, split(esc, 64<<10))
	// A tag of 30,000 keys goes in pieces, whole.
	tagger, err := follow.NewTagger("o", func(s string) (string, error) { return s, nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := range 30000 {
		keys = append(keys, strconv.Itoa(i))
	}
	content, err := tagger.Content("test", keys...)
	if err != nil {
		t.Fatal(err)
	}
	tagged := txMsg{Epoch: "e", DB: "1_5", LSN: 2, Prev: 1, Creates: keys, Tags: [][]byte{content}}
	parts = split(tagged, 256<<10)
	checkSplit(t, tagged, 256<<10, parts)
	if parts[len(parts)-1].Reread {
		t.Errorf("a tag of 30,000 keys made the followers read the table: %d parts", len(parts))
	}
	// A key that no part can hold is left out, and the table read.
	big := txMsg{Epoch: "e", DB: "1_5", LSN: 2, Prev: 1, Creates: []string{"a", strings.Repeat("k", 4096), "b"}}
	parts = split(big, 1024)
	checkSplit(t, big, 1024, parts)
	if !parts[len(parts)-1].Reread {
		t.Errorf("a key over the limit was left out without a reread: %+v", parts)
	}
}

func encodedLen(t *testing.T, m txMsg) int {
	t.Helper()
	b, err := m.encode()
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

// checkSplit checks the parts of m split under limit: in order, every key
// and tag once (but those that alone do not fit a part, which make the
// last part say Reread), every part encoded within the limit, with the
// transaction's position, reread on the last part only, parts numbered.
func checkSplit(t *testing.T, m txMsg, limit int, parts []txMsg) {
	t.Helper()
	if len(parts) == 0 {
		t.Fatal("no parts")
	}
	var creates, deletes []string
	var tags [][]byte
	for i, p := range parts {
		if p.Epoch != m.Epoch || p.DB != m.DB || p.Term != m.Term || p.LSN != m.LSN || p.Prev != m.Prev || p.Xid != m.Xid || p.Tok != m.Tok || p.Version != m.Version {
			t.Errorf("part %d: position %q %q %d %d %d %d %d %q, want %q %q %d %d %d %d %d %q", i, p.Epoch, p.DB, p.Term, p.LSN, p.Prev, p.Xid, p.Tok, p.Version,
				m.Epoch, m.DB, m.Term, m.LSN, m.Prev, m.Xid, m.Tok, m.Version)
		}
		if len(parts) > 1 && (p.Part != i || p.Parts != len(parts)) {
			t.Errorf("part %d: numbered %d of %d, want %d of %d", i, p.Part, p.Parts, i, len(parts))
		}
		if i < len(parts)-1 && p.Reread {
			t.Errorf("part %d of %d says reread: only the last may", i, len(parts))
		}
		if n := encodedLen(t, p); n > limit {
			t.Errorf("part %d: %d bytes encoded, over the limit %d", i, n, limit)
		}
		if len(parts) > 1 && len(p.Creates)+len(p.Deletes)+len(p.Tags) == 0 {
			t.Errorf("part %d of %d holds no key and no tag", i, len(parts))
		}
		creates, deletes, tags = append(creates, p.Creates...), append(deletes, p.Deletes...), append(tags, p.Tags...)
	}
	dropped := len(creates) < len(m.Creates) || len(deletes) < len(m.Deletes) || !bytes.Equal(bytes.Join(tags, nil), bytes.Join(m.Tags, nil))
	if last := parts[len(parts)-1]; last.Reread != (m.Reread || dropped) {
		t.Errorf("the last part says reread %v; the transaction %v, with keys or tags left out: %v", last.Reread, m.Reread, dropped)
	}
	if !isSubsequence(creates, m.Creates) || !isSubsequence(deletes, m.Deletes) {
		t.Errorf("the parts create %q and delete %q: not in the order of %q and %q", creates, deletes, m.Creates, m.Deletes)
	}
}

// isSubsequence reports whether got is want less some of its elements.
func isSubsequence[E any](got, want []E) bool {
	i := 0
	for _, w := range want {
		if i < len(got) && reflect.DeepEqual(got[i], w) {
			i++
		}
	}
	return i == len(got)
}

// FuzzDecodeTx feeds decodeTx what a stream could hold: it never panics,
// refuses a message without an epoch or a database or with a part out of
// range, and a
// message it accepts encodes and decodes to itself.
func FuzzDecodeTx(f *testing.F) {
	for _, m := range []txMsg{
		{Epoch: "e", DB: "1_5", LSN: 1, Prev: 0},
		{Epoch: "e", DB: "1_5", Term: 3, LSN: 2, Prev: 1, Xid: 9, Part: 1, Parts: 3, Creates: []string{"a"}, Deletes: []string{"b"}},
		{Epoch: "e", DB: "1_5", Reset: true, Reread: true, Version: "v", Tags: [][]byte{{0, 1, 2}}},
	} {
		b, err := m.encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"e":"x","i":2,"n":2}`))
	f.Add([]byte(`{"e":"","l":1}`))
	f.Add([]byte(`{"e":"x","n":-1}`))
	f.Add([]byte(`{"e":"x","l":18446744073709551615,"g":["AAE="]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeTx(b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fanout: decode a transaction message: ") {
				t.Errorf("error %q does not say what failed", err)
			}
			return
		}
		if m.Epoch == "" || m.DB == "" || m.Part < 0 || m.Parts < 0 || m.Parts > 0 && m.Part >= m.Parts {
			t.Fatalf("accepted %+v", m)
		}
		again, err := m.encode()
		if err != nil {
			t.Fatalf("encode %+v: %v", m, err)
		}
		m2, err := decodeTx(again)
		if err != nil {
			t.Fatalf("decode of %s: %v", again, err)
		}
		if !reflect.DeepEqual(normalize(m), normalize(m2)) {
			t.Errorf("decode(encode(%+v)) = %+v", m, m2)
		}
	})
}

// normalize makes empty and nil slices equal, as JSON's omitempty does.
func normalize(m txMsg) txMsg {
	if len(m.Creates) == 0 {
		m.Creates = nil
	}
	if len(m.Deletes) == 0 {
		m.Deletes = nil
	}
	if len(m.Tags) == 0 {
		m.Tags = nil
	}
	for i, g := range m.Tags {
		if len(g) == 0 {
			m.Tags[i] = nil
		}
	}
	return m
}

// FuzzSplit splits transactions made of fuzzed keys under fuzzed limits
// and checks every part (checkSplit); keys are the fuzz input cut at 0
// bytes, the first half creates and the rest deletes.
func FuzzSplit(f *testing.F) {
	f.Add([]byte("a\x00bb\x00ccc\x00dddd"), uint16(8), true)
	f.Add([]byte(""), uint16(1), false)
	f.Add([]byte(strings.Repeat("key\x00", 100)), uint16(30), false)
	f.Add([]byte("a-very-long-key-over-the-limit\x00b"), uint16(5), true)
	f.Add([]byte(strings.Repeat("<\"\\\x01\x00", 50)), uint16(40), true)
	f.Fuzz(func(t *testing.T, b []byte, limit uint16, reread bool) {
		// limit is what a part may take beyond its smallest encoding.
		var keys []string
		if len(b) > 0 {
			keys = strings.Split(string(b), "\x00")
		}
		h := len(keys) / 2
		m := txMsg{Epoch: "e", DB: "1_5", Term: 2, LSN: 5, Prev: 4, Xid: 3, Version: "v", Reread: reread,
			Creates: keys[:h:h], Deletes: keys[h:]}
		if reread {
			m.Tags = [][]byte{[]byte("t")}
		}
		if len(m.Creates) == 0 {
			m.Creates = nil
		}
		if len(m.Deletes) == 0 {
			m.Deletes = nil
		}
		floor := encodedLen(t, txMsg{Epoch: m.Epoch, DB: m.DB, Term: m.Term, LSN: m.LSN, Prev: m.Prev, Xid: m.Xid, Version: m.Version,
			Part: 1 << 30, Parts: 1 << 30, Reread: true, Creates: []string{""}, Deletes: []string{""}, Tags: [][]byte{{}}})
		parts := split(m, floor+int(limit))
		checkSplit(t, m, floor+int(limit), parts)
		for _, p := range parts {
			enc, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := decodeTx(enc); err != nil {
				t.Errorf("part %s does not decode: %v", enc, err)
			}
		}
	})
}
