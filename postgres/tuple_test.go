package postgres

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// The tests in this file check keys of several columns (tuple.go) without
// a server; keytuple_test.go follows such tables on one.

// testTupleRule returns the rule of a key (int4, citext, numeric, uuid)
// or of the first n of those columns, with a citext map of a few letters.
func testTupleRule(t testing.TB, n int) *keyRule {
	t.Helper()
	lower := &lowerMap{runes: map[rune]string{'Σ': "σ", 'İ': "i̇"}}
	for c := range lower.keep {
		lower.keep[c] = c < 'A' || c > 'Z'
	}
	for c := 'A'; c <= 'Z'; c++ {
		lower.runes[c] = string(c + 'a' - 'A')
	}
	var parts []*keyRule
	for _, base := range []string{"int4", "citext", "numeric", "uuid"}[:n] {
		if base == "citext" {
			parts = append(parts, &keyRule{typ: "citext", canon: lower.canon, server: lower.canon, lower: lower})
			continue
		}
		r, err := keyRuleFor(keyColumn{schema: "pg_catalog", base: base, deterministic: true}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.typ = base
		parts = append(parts, r)
	}
	return tupleRule(parts)
}

// TestTupleText: a Tuple's text is injective (no text inside a column can
// make two keys one) and each key has one text: Texts refuses any other.
func TestTupleText(t *testing.T) {
	for _, texts := range [][]string{
		{"7", "alice"}, {"", ""}, {"1:2", "3"}, {"1", ":23"}, {"a\x00b", "10:xxxxxxxxxx"}, {strings.Repeat("é", 100), "x", "y"},
	} {
		tp := TupleOf(texts...)
		got, err := tp.Texts()
		if err != nil || fmt.Sprint(got) != fmt.Sprint(texts) || len(got) != len(texts) {
			t.Errorf("TupleOf(%q).Texts() = %q, %v; want %q", texts, got, err, texts)
		}
	}
	if a, b := TupleOf("1:2", "3"), TupleOf("1", "2", "3"); a == b {
		t.Errorf("TupleOf of two keys is one text %q", a)
	}
	for _, bad := range []string{"", "1", "1:", "2:a", "01:a", "+1:a", "-1:a", "1:a0", "1:ab", ":a", "x:a", "1:a1", "1234567890:a", strings.Repeat("0:", maxKeyColumns+1)} {
		if got, err := Tuple(bad).Texts(); err == nil {
			t.Errorf("Tuple(%q).Texts() = %q, want an error", bad, got)
		}
		if _, err := ParseTuple(bad); err == nil {
			t.Errorf("ParseTuple(%q) took it", bad)
		}
	}
	if got, err := ParseTuple("1:75:alice"); err != nil || got != TupleOf("7", "alice") {
		t.Errorf(`ParseTuple("1:75:alice") = %q, %v`, got, err)
	}
}

// TestColumns: the key column argument of a key of several columns, and
// what is refused.
func TestColumns(t *testing.T) {
	if got := Columns("id"); got != "id" {
		t.Errorf(`Columns("id") = %q, want "id"`, got)
	}
	cols, err := splitColumns(Columns("tenant_id", "Id", "a,b"))
	if err != nil || fmt.Sprint(cols) != "[tenant_id Id a,b]" {
		t.Errorf("splitColumns = %q, %v", cols, err)
	}
	if got, want := sanitizeColumns(cols), `"tenant_id", "Id", "a,b"`; got != want {
		t.Errorf("sanitizeColumns = %s, want %s", got, want)
	}
	for _, bad := range []string{"", Columns("a", ""), Columns("a", "a"), Columns(strings.Split(strings.Repeat("c,", maxKeyColumns+1), ",")...)} {
		if cols, err := splitColumns(bad); err == nil {
			t.Errorf("splitColumns(%q) = %q, want an error", bad, cols)
		}
	}
}

// TestTupleForms: each column of a key is made canonical by its own
// type's rule, whatever the others are: a citext id in another case, an
// upper-case uuid in braces, numeric 1.50 for 1.5, an integer with a plus
// sign. A key of another number of columns, or with a column its rule
// cannot read, is an error that names the column.
func TestTupleForms(t *testing.T) {
	r := testTupleRule(t, 4)
	const u = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
	want := string(TupleOf("7", "alice@example.com", "1.5", u))
	for _, in := range []Tuple{
		TupleOf("7", "alice@example.com", "1.5", u),
		TupleOf("+7", "Alice@Example.COM", "1.50", "{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}"),
		TupleOf("007", "ALICE@EXAMPLE.COM", "0001.500", "A0EEBC999C0B4EF8BB6D6BB9BD380A11"),
	} {
		got, err := r.key(string(in))
		if err != nil || got != want {
			t.Errorf("key(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, tc := range []struct {
		in   Tuple
		want string
	}{
		{TupleOf("7", "alice"), "a key of 2 columns, not 4"},
		{TupleOf("7", "a", "1.5", u, "x"), "a key of 5 columns, not 4"},
		{TupleOf("seven", "a", "1.5", u), "column 1, of type int4"},
		{TupleOf("7", "a", "1.5.0", u), "column 3, of type numeric"},
		{TupleOf("7", "a", "1.5", "not a uuid"), "column 4, of type uuid"},
		{"7alice", "tuple column 1"},
	} {
		if got, err := r.key(string(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("key(%q) = %q, %v; want an error with %q", tc.in, got, err, tc.want)
		}
	}
	if got, err := r.fromServer(string(TupleOf("7", "Bob", "2.50", u))); err != nil || got != string(TupleOf("7", "bob", "2.5", u)) {
		t.Errorf("fromServer = %q, %v", got, err)
	}
}

// member is a caller's struct key of a table keyed by (tenant_id, id),
// read from and written as a Tuple.
type member struct {
	tenant int32
	id     string
}

func parseMember(s string) (member, error) {
	texts, err := Tuple(s).Texts()
	if err != nil {
		return member{}, err
	}
	if len(texts) != 2 {
		return member{}, fmt.Errorf("a key of %d columns, not 2", len(texts))
	}
	n, err := strconv.ParseInt(texts[0], 10, 32)
	if err != nil {
		return member{}, err
	}
	return member{int32(n), texts[1]}, nil
}

func (m member) text() string {
	return string(TupleOf(strconv.FormatInt(int64(m.tenant), 10), m.id))
}

// TestTupleKeyRule: the rule a follower installs in its Loader makes each
// column canonical, for a Tuple key and for a struct of the caller's; a
// key it cannot judge is an error (the Loader passes it to the store),
// never a panic. Tag refuses a key in another form.
func TestTupleKeyRule(t *testing.T) {
	rule := testTupleRule(t, 2)
	t.Run("Tuple", func(t *testing.T) {
		tags, err := newTagger("A", ParseTuple, nil)
		if err != nil {
			t.Fatal(err)
		}
		tags.setColumn(&column{key: Columns("tenant_id", "id")})
		tags.setRule(rule)
		canon := tags.KeyRule()
		if canon == nil {
			t.Fatal("KeyRule is nil for Tuple keys")
		}
		if k, err := canon(TupleOf("+7", "Alice")); err != nil || k != TupleOf("7", "alice") {
			t.Errorf("rule(+7, Alice) = %q, %v", k, err)
		}
		if k, err := tags.Key(string(TupleOf("07", "ALICE"))); err != nil || k != TupleOf("7", "alice") {
			t.Errorf("Key(07, ALICE) = %q, %v", k, err)
		}
		for _, bad := range []Tuple{TupleOf("7"), TupleOf("x", "a"), "garbage", ""} {
			if k, err := canon(bad); err == nil {
				t.Errorf("rule(%q) = %q, want an error", bad, k)
			}
		}
		if _, _, err := tags.Query(TupleOf("7", "Alice")); err == nil {
			t.Error("Tag of a key in another form: no error")
		}
		if _, _, err := tags.Query(TupleOf("7", "alice")); err != nil {
			t.Errorf("Tag of a canonical key = %v", err)
		}
	})
	t.Run("struct", func(t *testing.T) {
		tags, err := newTagger("A", parseMember, member.text)
		if err != nil {
			t.Fatal(err)
		}
		if tags.KeyRule() != nil {
			t.Fatal("KeyRule of a struct key of one column is not nil")
		}
		tags.setColumn(&column{key: Columns("tenant_id", "id")})
		tags.setRule(rule)
		canon := tags.KeyRule()
		if canon == nil {
			t.Fatal("KeyRule is nil for a struct key of several columns")
		}
		if k, err := canon(member{7, "Alice"}); err != nil || k != (member{7, "alice"}) {
			t.Errorf("rule({7 Alice}) = %v, %v", k, err)
		}
		q, _, err := tags.Query(member{7, "alice"})
		if err != nil || q == "" {
			t.Errorf("Tag of a canonical struct key = %v", err)
		}
	})
}

// TestDecoderTupleKeys: the decoder reads a key of several columns from
// the columns of the relation, in the key's order whatever the
// relation's, and passes on its canonical Tuple; an update of any key
// column is the old key's delete and the new key's create.
func TestDecoderTupleKeys(t *testing.T) {
	table := decodedTable{schema: "app", rel: "members", key: Columns("tenant_id", "id"), rule: testTupleRule(t, 2)}
	d := newDecoder(table)
	r := &recorder{}
	row := func(p *pgoutput, id, tenant string) {
		p.u16(2).u8('t').u32(uint32(len(id)))
		p.b = append(p.b, id...)
		p.u8('t').u32(uint32(len(tenant)))
		p.b = append(p.b, tenant...)
	}
	ins := (&pgoutput{}).u8('I').u32(5).u8('N')
	row(ins, "Alice", "7")
	upd := (&pgoutput{}).u8('U').u32(5).u8('K')
	row(upd, "Alice", "7")
	upd.u8('N')
	row(upd, "Alice", "8")
	del := (&pgoutput{}).u8('D').u32(5).u8('K')
	row(del, "BOB", "9")
	feed(t, d, r, relationMsg(5, "app", "members", "id", "tenant_id"), begin(1), ins.b, upd.b, del.b, commit(0x100))
	tx := r.txns[0]
	a7, a8, b9 := TupleOf("7", "alice"), TupleOf("8", "alice"), TupleOf("9", "bob")
	if got, want := join(tx.tables[0].creates)+"/"+join(tx.tables[0].deletes), fmt.Sprintf("%s,%s/%s,%s", a7, a8, a7, b9); got != want {
		t.Fatalf("creates/deletes = %q, want %q", got, want)
	}
	d = newDecoder(table)
	err := d.decode(relationMsg(5, "app", "members", "id", "name"), r)
	if !errors.Is(err, ErrNotPublished) || !strings.Contains(err.Error(), "tenant_id") {
		t.Fatalf("a relation without a key column = %v, want ErrNotPublished naming it", err)
	}
}

// FuzzTupleForm: the form of a key of several columns never panics, is
// its own form, names as many columns as the key has, and is bounded:
// at most 3·len(s) + 96·columns bytes (each column's form is at most
// 3 bytes a byte and 64, FuzzKeyForms; its length prefix at most 11 more
// and its colon one).
func FuzzTupleForm(f *testing.F) {
	for _, s := range []string{
		string(TupleOf("7", "Alice", "1.50", "{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}")),
		string(TupleOf("7", "ΣΣ", "1e262144", "x")),
		string(TupleOf("2147483648", "a")), "1:7", "", "0:0:0:0:", "99999999:a",
		string(TupleOf("-0", "İİİİ", "9.999999999e131071", "a0eebc999c0b4ef8bb6d6bb9bd380a11")),
	} {
		f.Add(s)
	}
	rules := []*keyRule{testTupleRule(f, 2), testTupleRule(f, 3), testTupleRule(f, 4)}
	f.Fuzz(func(t *testing.T, s string) {
		for _, r := range rules {
			for _, form := range []func(string) (string, error){r.key, r.fromServer} {
				got, err := form(s)
				if err != nil {
					continue
				}
				if again, err := form(got); err != nil || again != got {
					t.Errorf("%s: form(%q) = %q, whose form is %q, %v", r.typ, s, got, again, err)
				}
				if texts, err := Tuple(got).Texts(); err != nil || len(texts) != len(r.parts) {
					t.Errorf("%s: form(%q) = %q: %d columns, %v", r.typ, s, got, len(texts), err)
				}
				if len(got) > 3*len(s)+96*len(r.parts) {
					t.Errorf("%s: form(%q) is %d bytes, over 3×%d+96×%d", r.typ, s, len(got), len(s), len(r.parts))
				}
			}
		}
		// Any text splits into columns that make it again, or is refused.
		if texts, err := Tuple(s).Texts(); err == nil && string(TupleOf(texts...)) != s {
			t.Errorf("Tuple(%q).Texts() = %q, which make %q", s, texts, TupleOf(texts...))
		}
	})
}
