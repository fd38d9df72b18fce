package mysql

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"
)

// weights is a collation's equality, as the server's own WEIGHT_STRING
// gives it, for a collation that weighs each character alone with one
// 16-bit weight (utf8mb4_general_ci and its kin): two texts are equal
// exactly when their characters' weights are, after trailing spaces under
// PAD SPACE. A key's one text then is each character replaced by the
// first character of its weight (the lowest code point): "Straße" is
// "STRASSE"'s form, "STRASE", under utf8mb4_general_ci, where ß weighs as
// s. The server reads that text as the key, so a store lookup in it
// finds the row.
type weights struct {
	collation string
	of        []uint16 // of[r]: the weight of BMP character r
	first     []rune   // first[w]: the lowest character of weight w
	supp      uint16   // the weight of every supplementary (4-byte) character

	// uca, when not nil, is the collation's equality instead: a UCA
	// collation of ucaCollations.
	uca *uca
}

// validCollation is a collation name as the server spells them: it goes
// into SQL text.
var validCollation = regexp.MustCompile(`^[a-z0-9_]+$`)

// loadWeights asks the server for the weight of every BMP character and
// of a few supplementary ones under collation (for one of ucaCollations,
// of every character: loadUCA), and returns an error
// wrapping ErrKeyType for a collation whose weights are not one 16-bit
// weight per character, or whose supplementary characters do not all
// weigh the same. It then checks the form against the server's own =
// on random texts (verify).
func loadWeights(conn *client.Conn, collation string) (*weights, error) {
	if !validCollation.MatchString(collation) {
		return nil, fmt.Errorf("%w: collation %q", ErrKeyType, collation)
	}
	refuse := func(why string) (*weights, error) {
		return nil, fmt.Errorf("%w: collation %s %s; the guard cannot hold its equality: %s", ErrKeyType, collation, why, collationFix)
	}
	if _, err := conn.Execute("SET SESSION max_recursive_iterations = 70000"); err != nil {
		return nil, fmt.Errorf("mysql: read collation %s: %w", collation, err)
	}
	charset, _, _ := strings.Cut(collation, "_")
	if charset != "utf8mb4" && charset != "utf8mb3" {
		return refuse("is not of utf8mb4 or utf8mb3")
	}
	if why := ucaRefusal(collation); why != "" {
		return refuse(why)
	}
	if ucaCollations[collation] {
		u, err := loadUCA(conn, collation, charset)
		if err != nil {
			return nil, err
		}
		return &weights{collation: collation, uca: u}, nil
	}
	w := &weights{collation: collation, of: make([]uint16, 0x10000), first: make([]rune, 0x10000)}
	for i := range w.first {
		w.first[i] = -1
	}
	q := `WITH RECURSIVE cp(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM cp WHERE n < 65535)
		SELECT n, WEIGHT_STRING(CONVERT(CHAR(n USING utf32) USING ` + charset + `) COLLATE ` + collation + `)
		FROM cp WHERE n NOT BETWEEN 55296 AND 57343 ORDER BY n`
	r, err := conn.Execute(q)
	if err != nil {
		return nil, fmt.Errorf("mysql: read the weights of collation %s: %w", collation, err)
	}
	for i := range r.RowNumber() {
		n, _ := r.GetInt(i, 0)
		ws, _ := r.GetString(i, 1)
		if len(ws) != 2 {
			return refuse(fmt.Sprintf("weighs U+%04X with %d bytes (an expansion, or an ignorable character)", n, len(ws)))
		}
		wt := uint16(ws[0])<<8 | uint16(ws[1])
		w.of[n] = wt
		if w.first[wt] < 0 {
			w.first[wt] = rune(n)
		}
	}
	if r.RowNumber() != 0x10000-0x800 {
		return refuse(fmt.Sprintf("gave %d BMP weights", r.RowNumber()))
	}
	if charset == "utf8mb3" {
		w.supp = w.of[0xFFFD] // never used: canon refuses 4-byte characters
		return w, w.verify(conn, charset)
	}
	// Supplementary characters: the first and last of each plane in use,
	// and a few common ones (emoji, CJK extension B).
	var sel []string
	for _, cp := range []rune{0x10000, 0x1F600, 0x1F642, 0x1FFFD, 0x20000, 0x2A6D6, 0x10FFFD} {
		sel = append(sel, fmt.Sprintf("WEIGHT_STRING(CONVERT(CHAR(%d USING utf32) USING utf8mb4) COLLATE %s)", cp, collation))
	}
	r, err = conn.Execute("SELECT " + strings.Join(sel, ", "))
	if err != nil {
		return nil, fmt.Errorf("mysql: read the weights of collation %s: %w", collation, err)
	}
	for i := range sel {
		ws, _ := r.GetString(0, i)
		if len(ws) != 2 {
			return refuse("weighs a 4-byte character with other than 2 bytes")
		}
		wt := uint16(ws[0])<<8 | uint16(ws[1])
		if i > 0 && wt != w.supp {
			return refuse("weighs 4-byte characters differently")
		}
		w.supp = wt
	}
	if w.first[w.supp] < 0 {
		return refuse("weighs 4-byte characters as no BMP character")
	}
	if err := w.verify(conn, charset); err != nil {
		return nil, err
	}
	return w, nil
}

// canon returns text's form: each character replaced by the first of its
// weight, less trailing spaces under PAD SPACE (any character that
// weighs as the space). text is valid UTF-8.
func (w *weights) canon(text string, pad, mb3 bool, col string) (string, error) {
	if w.uca != nil {
		return w.uca.canon(text, pad, mb3, col)
	}
	var b strings.Builder
	b.Grow(len(text))
	for _, r := range text {
		switch {
		case r > 0xFFFF && mb3:
			return "", fmt.Errorf("mysql: key %q of %s has a 4-byte character, which utf8mb3 cannot hold", text, col)
		case r > 0xFFFF:
			b.WriteRune(w.first[w.supp])
		default:
			b.WriteRune(w.first[w.of[r]])
		}
	}
	s := b.String()
	if pad {
		s = strings.TrimRight(s, string(w.first[w.of[' ']]))
	}
	return s, nil
}

// variant returns s with the case of each character flipped at random
// and its trailing spaces changed: a text a case-insensitive PAD SPACE
// collation takes for s.
func variant(rnd *rand.Rand, s string) string {
	var b strings.Builder
	for _, r := range s {
		if rnd.IntN(2) == 0 {
			b.WriteString(strings.ToUpper(string(r)))
		} else {
			b.WriteString(strings.ToLower(string(r)))
		}
	}
	return strings.TrimRight(b.String(), " ") + strings.Repeat(" ", rnd.IntN(3))
}

// verify compares the form with the server's own = on random texts that
// differ in case, accents, ß, trailing spaces and 4-byte characters, and
// returns an error wrapping ErrKeyType at the first disagreement: a
// collation whose equality is not that of its characters' weights (a
// contraction) is refused.
func (w *weights) verify(conn *client.Conn, charset string) error {
	const pairs = 300
	alphabet := []string{"a", "A", "á", "Á", "à", "ä", "å", "s", "S", "ß", "ẞ", "e", "é", "È", "i", "İ", "ı", "o", "ø", "Œ", "œ", "c", "ç", " ", "-", "_", "1", "😀", "🙂", "𠀀", "ǅ", "ǆ", "Ǆ", "ﬀ", "ff", "Ω", "ω", "Ꭰ", "ꭰ"}
	rnd := rand.New(rand.NewPCG(1, 2)) // the same texts at every start
	word := func() string {
		var b strings.Builder
		for range 1 + rnd.IntN(4) {
			b.WriteString(alphabet[rnd.IntN(len(alphabet))])
		}
		return b.String()
	}
	lit := func(s string) string {
		return "CONVERT(X'" + hex.EncodeToString([]byte(s)) + "' USING " + charset + ") COLLATE " + w.collation
	}
	as, bs := make([]string, pairs), make([]string, pairs)
	sel := make([]string, pairs)
	mb3 := charset == "utf8mb3"
	for i := 0; i < pairs; {
		as[i] = word()
		if mb3 && hasSupplementary(as[i]) {
			continue
		}
		// Half the pairs are the same word in other characters.
		if rnd.IntN(2) == 0 {
			bs[i] = word()
		} else {
			bs[i] = variant(rnd, as[i])
		}
		if mb3 && hasSupplementary(bs[i]) {
			continue
		}
		sel[i] = lit(as[i]) + " = " + lit(bs[i])
		i++
	}
	r, err := conn.Execute("SELECT " + strings.Join(sel, ", "))
	if err != nil {
		return fmt.Errorf("mysql: check collation %s: %w", w.collation, err)
	}
	pad := !strings.Contains(w.collation, "_nopad_")
	for i := range pairs {
		eq, _ := r.GetInt(0, i)
		ca, _ := w.canon(as[i], pad, false, "")
		cb, _ := w.canon(bs[i], pad, false, "")
		if (eq == 1) != (ca == cb) {
			return fmt.Errorf("%w: collation %s: the server says %q = %q is %v, its weights say %v: the guard cannot hold its equality; %s",
				ErrKeyType, w.collation, as[i], bs[i], eq == 1, ca == cb, collationFix)
		}
	}
	return nil
}
