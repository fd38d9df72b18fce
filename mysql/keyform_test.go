package mysql

import (
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/client"
)

func TestCanonDecimal(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"1.50", "1.5"}, {"001.500", "1.5"}, {"-0.00", "0"}, {"+2", "2"}, {"0", "0"}, {".5", "0.5"},
		{"5.", "5"}, {"-12.3400", "-12.34"}, {"100", "100"}, {"-0", "0"},
	} {
		got, err := canonDecimal(tc.in, "d")
		if err != nil || got != tc.want {
			t.Errorf("canonDecimal(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", ".", "-", "1e3", "1.2.3", " 1", "abc", "--1"} {
		if got, err := canonDecimal(in, "d"); err == nil {
			t.Errorf("canonDecimal(%q) = %q, want an error", in, got)
		}
	}
}

func TestIntForms(t *testing.T) {
	for _, tc := range []struct {
		columnType string
		dataType   string
		row        any
		want       string
	}{
		{"int(11)", "int", int32(-5), "-5"},
		{"int(10) unsigned", "int", int32(-1), "4294967295"},
		{"tinyint(3) unsigned", "tinyint", int8(-1), "255"},
		{"mediumint(8) unsigned", "mediumint", int32(-1), "16777215"},
		{"bigint(20) unsigned", "bigint", int64(-1), "18446744073709551615"},
		{"bigint(20)", "bigint", int64(-1), "-1"},
	} {
		k, err := formOf(column{name: "id", dataType: tc.dataType, columnType: tc.columnType}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, ok, err := k.fromRow(tc.row)
		if err != nil || !ok || got != tc.want {
			t.Errorf("%s: fromRow(%v) = %q, %v, %v; want %q", tc.columnType, tc.row, got, ok, err, tc.want)
		}
		if c, err := k.canon("0" + tc.want); tc.want[0] != '-' && (err != nil || c != tc.want) {
			t.Errorf("%s: canon(%q) = %q, %v; want %q", tc.columnType, "0"+tc.want, c, err, tc.want)
		}
	}
	k, _ := formOf(column{name: "id", dataType: "int", columnType: "int(10) unsigned"}, nil)
	for _, bad := range []string{"-1", "4294967296", "1.0", "x", ""} {
		if c, err := k.canon(bad); err == nil {
			t.Errorf("unsigned int: canon(%q) = %q, want an error", bad, c)
		}
	}
}

func TestFormRefusals(t *testing.T) {
	for _, c := range []column{
		{name: "k", dataType: "float", columnType: "float"},
		{name: "k", dataType: "timestamp", columnType: "timestamp(3)"},
		{name: "k", dataType: "time", columnType: "time(7)"},
		{name: "k", dataType: "year", columnType: "year(4)"},
		{name: "k", dataType: "binary", columnType: "binary(16)"},
		{name: "k", dataType: "varchar", columnType: "varchar(10)", charset: "latin1", collation: "latin1_swedish_ci"},
		{name: "k", dataType: "char", columnType: "char(10)", charset: "utf8mb4", collation: "utf8mb4_nopad_bin"},
	} {
		_, err := formOf(c, nil)
		if !errors.Is(err, ErrKeyType) || !strings.Contains(err.Error(), c.columnType) {
			t.Errorf("%s %s: got %v, want ErrKeyType naming the type", c.columnType, c.collation, err)
		}
	}
}

// TestCollationsAgainstServer compares the key forms of each collation
// with the server's own = on random texts: 0 disagreements, each text's
// form read by the server as the text (a store lookup in the form finds
// the row), and each collation the guard cannot hold refused with a
// message that names the column, the collation and what to do.
func TestCollationsAgainstServer(t *testing.T) {
	srv := testDSN(t)
	c := connect(t, srv)
	var total int
	for _, tc := range []struct {
		collation string
		refused   bool
	}{
		{"utf8mb4_general_ci", false},
		{"utf8mb4_general_nopad_ci", false},
		{"utf8mb3_general_ci", false},
		{"utf8mb4_bin", false},
		{"utf8mb4_nopad_bin", false},
		{"utf8mb4_unicode_ci", false},
		{"utf8mb4_unicode_nopad_ci", false},
		{"utf8mb4_unicode_520_ci", false},
		{"utf8mb4_unicode_520_nopad_ci", false},
		{"utf8mb3_unicode_ci", false},
		{"utf8mb3_unicode_520_ci", false},
		{"utf8mb4_german2_ci", true},
		{"utf8mb4_czech_ci", true},
		{"utf8mb4_uca1400_ai_ci", true},
		{"utf8mb4_uca1400_nopad_ai_ci", true},
		{"utf8mb4_uca1400_as_ci", true},
		{"utf8mb4_uca1400_as_cs", true},
		{"utf8mb4_uca1400_ai_cs", true},
		{"utf8mb4_uca1400_swedish_ai_ci", true},
	} {
		t.Run(tc.collation, func(t *testing.T) {
			charset, _, _ := strings.Cut(tc.collation, "_")
			col := column{name: "k", dataType: "varchar", columnType: "varchar(64)", charset: charset, collation: tc.collation}
			k, err := formOf(col, func(collation string) (*weights, error) { return loadWeights(c, collation) })
			if tc.refused {
				for _, says := range []string{"column k", tc.collation, "ALTER", "utf8mb4_general_ci"} {
					if !errors.Is(err, ErrKeyType) || !strings.Contains(err.Error(), says) {
						t.Fatalf("got %v, want ErrKeyType saying %q", err, says)
					}
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rnd := rand.New(rand.NewPCG(7, uint64(len(tc.collation))))
			checked, disagree := compareWithServer(t, c, k, charset, tc.collation, rnd, randomText, 3000)
			if strings.Contains(tc.collation, "unicode") {
				n, d := compareWithServer(t, c, k, charset, tc.collation, rnd, ucaText, 3000)
				checked, disagree = checked+n, disagree+d
			}
			total += checked
			if k.w != nil && k.w.uca != nil {
				u := k.w.uca
				t.Logf("the table: %d weights in a pool, %d runs of 4-byte characters, %d weight sequences", len(u.pool), len(u.supp), len(u.unit))
			}
			t.Logf("%d pairs, %d disagreements", checked, disagree)
			if disagree != 0 {
				t.Fatalf("%d of %d pairs: the form and the server's = disagree", disagree, checked)
			}
		})
	}
	t.Logf("%d pairs in all", total)
}

// TestUCAContractions checks that the UCA collations the guard holds join
// no character with a following one into one weight (a contraction,
// which the form cannot see), for every BMP character followed by each of
// a few that contract under the uca1400 collations, and that the check
// finds those: under utf8mb4_uca1400_ai_ci И and U+0306 weigh as Й.
func TestUCAContractions(t *testing.T) {
	if testing.Short() {
		t.Skip("1.1M pairs a collation")
	}
	srv := testDSN(t)
	c := connect(t, srv)
	// Combining marks of Latin, Cyrillic and kana, Thai and Lao vowels,
	// the middle dot and the apostrophe.
	seconds := "768,769,770,774,776,778,780,807,808,183,39,3633,3636,3655,3761,3764,12441,12442"
	for _, tc := range []struct {
		collation string
		want      int // contractions, at least
	}{
		{"utf8mb4_unicode_ci", 0},
		{"utf8mb4_unicode_520_ci", 0},
		{"utf8mb4_uca1400_ai_ci", 1},
	} {
		t.Run(tc.collation, func(t *testing.T) {
			ch := func(n string) string { return "CONVERT(CHAR(" + n + " USING utf32) USING utf8mb4)" }
			ws := func(s string) string { return "WEIGHT_STRING(" + s + " COLLATE " + tc.collation + ")" }
			q := `WITH RECURSIVE d(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 65535)
				SELECT COUNT(*), IFNULL(MIN(CONCAT(HEX(d.n), '+', HEX(b.n))), '') FROM d JOIN d b ON b.n IN (` + seconds + `)
				WHERE d.n NOT BETWEEN 55296 AND 57343 AND ` + ws("CONCAT("+ch("d.n")+", "+ch("b.n")+")") + ` <> CONCAT(` + ws(ch("d.n")) + `, ` + ws(ch("b.n")) + `)`
			exec(t, c, "SET SESSION max_recursive_iterations = 70000")
			r, err := c.Execute(q)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := r.GetInt(0, 0)
			first, _ := r.GetString(0, 1)
			t.Logf("%d pairs of %d characters: %d contractions (first %s)", (0x10000-0x800)*(strings.Count(seconds, ",")+1), 0x10000-0x800, n, first)
			if tc.want == 0 && n != 0 || tc.want > 0 && int(n) < tc.want {
				t.Fatalf("%d contractions, want %d", n, tc.want)
			}
		})
	}
}

// confusables are characters that collations take for one another.
var confusables = []string{"a", "A", "á", "Á", "à", "â", "ä", "Ä", "å", "æ", "s", "S", "ß", "ẞ", "e", "E", "é", "É", "ë", "i", "I", "İ", "ı", "o", "O", "ö", "ø", "œ",
	"u", "ü", "Ü", "c", "ç", "n", "ñ", "y", "ÿ", " ", "\t", "-", "_", "0", "1", "😀", "🙂", "𠀀", "ǅ", "ǆ", "Ǆ", "ﬀ", "ω", "Ω", "σ", "ς", "Σ", "\u00a0", "\u3000", "ａ", "Ａ"}

// randomText returns a text of confusable characters; under utf8mb3, none
// of 4 bytes.
func randomText(rnd *rand.Rand, mb3 bool) string {
	var b strings.Builder
	for range 1 + rnd.IntN(6) {
		s := confusables[rnd.IntN(len(confusables))]
		if mb3 && hasSupplementary(s) {
			s = "x"
		}
		b.WriteString(s)
	}
	if rnd.IntN(3) == 0 {
		b.WriteString(strings.Repeat(" ", 1+rnd.IntN(3)))
	}
	return b.String()
}

// compareWithServer compares k's equality with the server's = under
// collation on n random pairs, half of them variants of each other (the
// case of each character flipped at random, spaces appended).
func compareWithServer(t *testing.T, c *client.Conn, k *keyForm, charset, collation string, rnd *rand.Rand, text func(*rand.Rand, bool) string, n int) (checked, disagree int) {
	t.Helper()
	mb3 := charset == "utf8mb3"
	lit := func(s string) string {
		return "CONVERT(X'" + hex.EncodeToString([]byte(s)) + "' USING " + charset + ") COLLATE " + collation
	}
	const batch = 250
	for checked < n {
		as, bs, sel := make([]string, batch), make([]string, batch), make([]string, 0, 2*batch)
		cas, cbs := make([]string, batch), make([]string, batch)
		for i := range batch {
			as[i] = text(rnd, mb3)
			if rnd.IntN(2) == 0 {
				bs[i] = text(rnd, mb3)
			} else {
				bs[i] = variant(rnd, as[i])
			}
			var errA, errB error
			cas[i], errA = k.canon(as[i])
			cbs[i], errB = k.canon(bs[i])
			if errA != nil || errB != nil {
				t.Fatalf("canon(%q) = %v, canon(%q) = %v", as[i], errA, bs[i], errB)
			}
			// The server must read the form as the text: the store's
			// lookup gets the form.
			sel = append(sel, lit(as[i])+" = "+lit(bs[i]), lit(as[i])+" = "+lit(cas[i]))
		}
		r, err := c.Execute("SELECT " + strings.Join(sel, ", "))
		if err != nil {
			t.Fatal(err)
		}
		for i := range batch {
			eq, _ := r.GetInt(0, 2*i)
			self, _ := r.GetInt(0, 2*i+1)
			checked++
			if (eq == 1) != (cas[i] == cbs[i]) || self != 1 {
				disagree++
				if disagree <= 5 {
					t.Logf("%q = %q: server %v, form %v (%q, %q); the server reads the form as the text: %v", as[i], bs[i], eq == 1, cas[i] == cbs[i], cas[i], cbs[i], self == 1)
				}
			}
		}
	}
	return checked, disagree
}
