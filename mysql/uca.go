package mysql

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

// ucaCollations are the UCA collations whose equality the guard holds:
// the root tables of UCA 4.0.0 and 5.2.0, without a language's tailoring,
// which weigh at one level (case- and accent-insensitive) and join no two
// characters into one. A language's tailoring may (utf8mb4_czech_ci's
// "ch"), and so do the uca1400 collations (И and U+0306 weigh as Й); the
// server lists no contractions, so those are refused.
var ucaCollations = map[string]bool{
	"utf8mb4_unicode_ci": true, "utf8mb4_unicode_nopad_ci": true,
	"utf8mb4_unicode_520_ci": true, "utf8mb4_unicode_520_nopad_ci": true,
	"utf8mb3_unicode_ci": true, "utf8mb3_unicode_nopad_ci": true,
	"utf8mb3_unicode_520_ci": true, "utf8mb3_unicode_520_nopad_ci": true,
}

// collationFix says what to do with a column of a collation the guard
// cannot hold.
const collationFix = "ALTER the column to utf8mb4_unicode_520_ci or utf8mb4_unicode_ci (UCA, case- and accent-insensitive), " +
	"utf8mb4_general_ci (case- and accent-insensitive, each character alone) or utf8mb4_bin (as stored)"

// ucaRefusal says why the guard cannot hold collation, a utf8mb4 or
// utf8mb3 one, if it is a UCA collation not of ucaCollations: every such
// collation but the general and bin ones is.
func ucaRefusal(collation string) string {
	_, name, _ := strings.Cut(collation, "_")
	switch {
	case ucaCollations[collation] || strings.HasPrefix(name, "general_") || strings.HasSuffix(name, "bin"):
		return ""
	case strings.HasPrefix(name, "uca1400_"):
		return "is of UCA 14.0.0, which joins a letter and a combining mark into one letter (contractions: И and U+0306 weigh as Й), and the server does not list them"
	}
	return "is a language's tailoring of UCA, which may join letters into one (contractions: 'ch' under utf8mb4_czech_ci), and the server does not list them"
}

// ucaMax is the most weights the server gives one character under a UCA
// collation (U+FDFA has 8 under UCA 4.0.0 and 5.2.0).
const ucaMax = 8

// uca is the equality of one of ucaCollations: the server's = compares
// the texts' weight strings (less trailing weights of the space under PAD
// SPACE), each character weighing alone as a sequence of 0 to ucaMax
// 16-bit weights: none for an ignorable character (a combining accent),
// several for an expansion (ß weighs as ss, ﬀ as ff). A per-character
// form cannot hold that ("ß" and "ss" are one key), so a key's one text is
// built from its weight string alone: the fewest characters that weigh as
// it, each the lowest of its weight sequence, ties broken by the lowest
// first character ("Straße" and "STRASSE" are "STRASSE"). The server
// reads that text as the key, so a store lookup in it finds the row.
type uca struct {
	bmp  []uint32 // bmp[r]: BMP character r's weights, as a ref into pool
	pool []uint16
	supp []ucaRun // the supplementary characters' weights, in runs from U+10000
	// unit holds the lowest character of each character's weight
	// sequence, but for implicit weights (see ucaRun), which char
	// decodes.
	unit map[ucaSeq]rune
	// longest[w] is the most weights of a sequence of unit (or of
	// implicit weights) that begins with w: canon tries no longer ones.
	longest []uint8
	bases   []uint16 // the implicit runs' bases
	space   uint16   // the weight of ' '
}

// A ref is a weight sequence in pool: offset<<4 | length. refImplicit
// marks a character of implicit weight, refImplicit | base.
const refImplicit = 1 << 31

// A ucaRun is the weights of the characters from lo to the next run's lo:
// one ref for all of them, or, where ref has refImplicit, the implicit
// weights UCA computes for a character its table does not list (CJK
// ideographs, unassigned code points): r weighs [base + r>>15,
// r&0x7FFF | 0x8000].
type ucaRun struct {
	lo  rune
	ref uint32
}

type ucaSeq struct {
	n uint8
	w [ucaMax]uint16
}

// implicit returns the implicit weights of r, and whether r is of that
// form with one of the bases UCA 4.0.0 and 5.2.0 use.
func implicit(r rune, ws []uint16) (base uint16, ok bool) {
	if len(ws) != 2 || ws[1] != uint16(r&0x7FFF)|0x8000 {
		return 0, false
	}
	base = ws[0] - uint16(r>>15)
	return base, base == 0xFB40 || base == 0xFB80 || base == 0xFBC0
}

// loadUCA reads the weights of every character under collation, one of
// ucaCollations, from the server's own WEIGHT_STRING, and checks the form
// against the server's = on random texts. It returns an error wrapping
// ErrKeyType for weights it cannot hold.
func loadUCA(conn *client.Conn, collation, charset string) (*uca, error) {
	refuse := func(why string) (*uca, error) {
		return nil, fmt.Errorf("%w: collation %s %s; the guard cannot hold its equality: %s", ErrKeyType, collation, why, collationFix)
	}
	last := 0x10FFFF
	if charset == "utf8mb3" {
		last = 0xFFFF // canon refuses the others
	}
	u := &uca{bmp: make([]uint32, 0x10000), unit: make(map[ucaSeq]rune)}
	refs := make([]uint32, last+1) // transient: 4.4 MB under utf8mb4
	pooled := make(map[string]uint32)
	bases := make(map[uint16]bool)
	var bad string
	var rows int
	// Code points in blocks of 1024, so that the recursion stays short.
	q := fmt.Sprintf(`WITH RECURSIVE d(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < %d)
		SELECT hi.n * 1024 + lo.n, WEIGHT_STRING(CONVERT(CHAR(hi.n * 1024 + lo.n USING utf32) USING %s) COLLATE %s)
		FROM d hi JOIN d lo ON lo.n < 1024 WHERE hi.n * 1024 + lo.n <= %d AND hi.n * 1024 + lo.n NOT BETWEEN 55296 AND 57343`,
		max(last/1024, 1023), charset, collation, last)
	var res gomysql.Result
	defer res.Close()
	ws := make([]uint16, 0, ucaMax)
	err := conn.ExecuteSelectStreaming(q, &res, func(row []gomysql.FieldValue) error {
		n, err := strconv.Atoi(fieldText(&row[0]))
		if err != nil || n < 0 || n > last {
			return fmt.Errorf("code point %q", fieldText(&row[0]))
		}
		b := row[1].AsString()
		if len(b)%2 != 0 || len(b) > 2*ucaMax {
			if bad == "" {
				bad = fmt.Sprintf("weighs U+%04X with %d bytes", n, len(b))
			}
			return nil
		}
		rows++
		ws = ws[:0]
		for i := 0; i < len(b); i += 2 {
			ws = append(ws, uint16(b[i])<<8|uint16(b[i+1]))
		}
		if base, ok := implicit(rune(n), ws); ok && n > 0xFFFF {
			refs[n] = refImplicit | uint32(base)
			bases[base] = true
			return nil
		}
		ref, ok := pooled[string(b)]
		if !ok {
			ref = uint32(len(u.pool))<<4 | uint32(len(ws))
			u.pool = append(u.pool, ws...)
			pooled[string(b)] = ref
		}
		refs[n] = ref
		return nil
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("mysql: read the weights of collation %s: %w", collation, err)
	}
	if bad != "" {
		return refuse(bad)
	}
	if want := last + 1 - 0x800; rows != want {
		return refuse(fmt.Sprintf("gave %d weights of %d characters", rows, want))
	}
	copy(u.bmp, refs)
	for r := last; r > 0xFFFF; r-- { // lowest last
		if refs[r]&refImplicit == 0 {
			u.unit[u.seq(refs[r])] = rune(r)
		}
	}
	for r := 0xFFFF; r >= 0; r-- {
		if r < 0xD800 || r > 0xDFFF {
			u.unit[u.seq(refs[r])] = rune(r)
		}
	}
	for r := 0x10000; r <= last; r++ {
		if len(u.supp) == 0 || u.supp[len(u.supp)-1].ref != refs[r] {
			u.supp = append(u.supp, ucaRun{lo: rune(r), ref: refs[r]})
		}
	}
	u.supp = slices.Clip(u.supp)
	for b := range bases {
		u.bases = append(u.bases, b)
	}
	slices.Sort(u.bases)
	u.longest = make([]uint8, 0x10000)
	for s := range u.unit {
		u.longest[s.w[0]] = max(u.longest[s.w[0]], s.n)
	}
	if len(u.bases) > 0 {
		for w := int(u.bases[0]); w < len(u.longest); w++ {
			u.longest[w] = max(u.longest[w], 2)
		}
	}
	sp := u.weightsOf(' ', nil)
	if len(sp) != 1 {
		return refuse(fmt.Sprintf("weighs the space with %d weights", len(sp)))
	}
	u.space = sp[0]
	// Trailing spaces are trimmed from the weight string: no character
	// may weigh as more than the space and end as it, or the trim could
	// cut it (U+FDFA has the space's weight amid others).
	for s := range u.unit {
		if s.n > 1 && s.w[s.n-1] == u.space {
			return refuse("weighs a character as others and then the space")
		}
	}
	if err := u.verify(conn, collation, charset); err != nil {
		return nil, err
	}
	return u, nil
}

// seq returns the weight sequence ref names, as a map key.
func (u *uca) seq(ref uint32) ucaSeq {
	s := ucaSeq{n: uint8(ref & 15)}
	copy(s.w[:], u.pool[ref>>4:ref>>4+ref&15])
	return s
}

// weightsOf appends r's weights to ws.
func (u *uca) weightsOf(r rune, ws []uint16) []uint16 {
	var ref uint32
	if r <= 0xFFFF {
		ref = u.bmp[r]
	} else {
		i, _ := slices.BinarySearchFunc(u.supp, r, func(run ucaRun, r rune) int { return int(run.lo - r) })
		if i == len(u.supp) || u.supp[i].lo != r {
			i--
		}
		ref = u.supp[i].ref
	}
	if ref&refImplicit != 0 {
		return append(ws, uint16(ref)+uint16(r>>15), uint16(r&0x7FFF)|0x8000)
	}
	return append(ws, u.pool[ref>>4:ref>>4+ref&15]...)
}

// char returns the lowest character that weighs as ws alone.
func (u *uca) char(ws []uint16) (rune, bool) {
	s := ucaSeq{n: uint8(len(ws))}
	copy(s.w[:], ws)
	r, ok := u.unit[s]
	if len(ws) == 2 && ws[1]&0x8000 != 0 {
		for _, b := range u.bases {
			c := rune(ws[0]-b)<<15 | rune(ws[1]&0x7FFF)
			if ws[0] < b || c <= 0xFFFF || c > 0x10FFFF || ok && c >= r {
				continue
			}
			var buf [ucaMax]uint16
			if w := u.weightsOf(c, buf[:0]); len(w) == 2 && w[0] == ws[0] && w[1] == ws[1] {
				r, ok = c, true
			}
		}
	}
	return r, ok
}

// canon returns text's form (see uca). text is valid UTF-8.
func (u *uca) canon(text string, pad, mb3 bool, col string) (string, error) {
	ws := make([]uint16, 0, len(text))
	for _, r := range text {
		if r > 0xFFFF && mb3 {
			return "", fmt.Errorf("mysql: key %q of %s has a 4-byte character, which utf8mb3 cannot hold", text, col)
		}
		ws = u.weightsOf(r, ws)
	}
	if pad {
		for len(ws) > 0 && ws[len(ws)-1] == u.space {
			ws = ws[:len(ws)-1]
		}
	}
	// From the end: count[i] is the fewest characters that weigh as
	// ws[i:], -1 for none; first[i] the lowest first of them, of step[i]
	// weights. text's own characters are one way, so there is one.
	n := len(ws)
	count := make([]int32, n+1)
	first := make([]rune, n+1)
	step := make([]uint8, n+1)
	for i := n - 1; i >= 0; i-- {
		count[i] = -1
		for l := 1; l <= int(u.longest[ws[i]]) && i+l <= n; l++ {
			if count[i+l] < 0 {
				continue
			}
			r, ok := u.char(ws[i : i+l])
			if !ok {
				continue
			}
			if c := count[i+l] + 1; count[i] < 0 || c < count[i] || c == count[i] && r < first[i] {
				count[i], first[i], step[i] = c, r, uint8(l)
			}
		}
	}
	if count[0] < 0 {
		return "", fmt.Errorf("mysql: key %q of %s: no text weighs as it under its collation", text, col)
	}
	var b strings.Builder
	b.Grow(len(text))
	for i := 0; i < n; i += int(step[i]) {
		b.WriteRune(first[i])
	}
	return b.String(), nil
}

// ucaAlphabet holds characters UCA collations take for others: cases,
// accents, expansions (ß, æ, ﬀ, ǅ, ㎏), ignorable ones (combining marks, a
// soft hyphen, a zero-width joiner), spaces, CJK ideographs and other
// characters of implicit weight, 4-byte ones.
var ucaAlphabet = []string{"a", "A", "á", "Á", "ä", "æ", "Æ", "e", "é", "\u0301", "\u0308", "s", "S", "ß", "ẞ", "ss", "f", "ﬀ", "ff",
	"d", "ž", "ǅ", "ǆ", "Ǆ", "k", "g", "㎏", "kg", "i", "İ", "ı", "o", "ø", "œ", "\u00ad", "\u200d", " ", "\u00a0", "\u3000",
	"-", "1", "¹", "①", "¨", "\ufdfa", "\u0635\u0644\u0649 \u0627\u0644\u0644\u0647", "一", "丁", "\U00020000", "😀", "🙂", "\U0001F600", "𝐀", "\U000E0001", "\U0010FFFD", "ω", "Ω", "й", "и\u0306"}

// ucaText returns a random text of ucaAlphabet; under utf8mb3, with no
// 4-byte character.
func ucaText(rnd *rand.Rand, mb3 bool) string {
	var b strings.Builder
	for range 1 + rnd.IntN(5) {
		s := ucaAlphabet[rnd.IntN(len(ucaAlphabet))]
		if mb3 && hasSupplementary(s) {
			s = "x"
		}
		b.WriteString(s)
	}
	return b.String()
}

// verify compares the form with the server's own = on random texts of
// ucaAlphabet, and checks that the server reads each text's form as the
// text, and returns an error wrapping ErrKeyType at the first
// disagreement.
func (u *uca) verify(conn *client.Conn, collation, charset string) error {
	const pairs = 200
	rnd := rand.New(rand.NewPCG(3, 4)) // the same texts at every start
	mb3 := charset == "utf8mb3"
	pad := !strings.Contains(collation, "_nopad_")
	lit := func(s string) string {
		return "CONVERT(X'" + hex.EncodeToString([]byte(s)) + "' USING " + charset + ") COLLATE " + collation
	}
	as, bs, sel := make([]string, pairs), make([]string, pairs), make([]string, 0, 2*pairs)
	for i := range pairs {
		as[i] = ucaText(rnd, mb3)
		if rnd.IntN(2) == 0 {
			bs[i] = ucaText(rnd, mb3)
		} else {
			bs[i] = variant(rnd, as[i])
		}
		fa, err := u.canon(as[i], pad, mb3, "")
		if err != nil {
			return fmt.Errorf("%w: collation %s: %v", ErrKeyType, collation, err)
		}
		sel = append(sel, lit(as[i])+" = "+lit(bs[i]), lit(as[i])+" = "+lit(fa))
	}
	r, err := conn.Execute("SELECT " + strings.Join(sel, ", "))
	if err != nil {
		return fmt.Errorf("mysql: check collation %s: %w", collation, err)
	}
	for i := range pairs {
		eq, _ := r.GetInt(0, 2*i)
		self, _ := r.GetInt(0, 2*i+1)
		ca, errA := u.canon(as[i], pad, mb3, "")
		cb, errB := u.canon(bs[i], pad, mb3, "")
		if errA != nil || errB != nil || (eq == 1) != (ca == cb) || self != 1 {
			return fmt.Errorf("%w: collation %s: the server says %q = %q is %v, and %q = its form %q is %v; the guard's form disagrees: %s",
				ErrKeyType, collation, as[i], bs[i], eq == 1, as[i], ca, self == 1, collationFix)
		}
	}
	return nil
}
