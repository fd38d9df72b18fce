package postgres

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/internal/testrand"
)

// The canonical forms (keyform.go) are checked against the server: for
// each key type, texts in the forms applications write (case, padding,
// scale, time zones, units, abbreviations) go to the server, which says
// what value each is and which are equal; a form must agree with every
// answer. A form that disagrees once is a wrong 404 waiting for its key.

// formCase is one key type and the texts it is checked on.
type formCase struct {
	typ   string   // the key column's type, as SQL names it
	texts []string // application forms, valid or not
	cast  string   // the type a lookup's parameter has, if not typ: no length (a lookup of "abcdefg" in a character(5) column is not truncated)
}

// ensureCitext makes sure the citext extension exists, in public (an
// extension is the database's: tests of other packages may make it at
// the same moment).
func ensureCitext(t *testing.T, c *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	for try := 0; ; try++ {
		_, err := c.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS citext SCHEMA public`)
		if err == nil {
			return
		}
		var ok bool
		if c.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citext')`).Scan(&ok); ok {
			return
		}
		if try == 3 {
			t.Skipf("citext is not available: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// keyFormCases returns the cases, with seeded random texts.
func keyFormCases(seed uint64) []formCase {
	r := rand.New(rand.NewPCG(seed, 1))
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	var ints []string
	for range 60 {
		v := r.Int64N(2000) - 1000
		if r.IntN(4) == 0 {
			v = int64(r.Uint64())
		}
		s := strconv.FormatInt(v, 10)
		switch r.IntN(4) {
		case 0:
			s = strings.Replace("0"+s, "0-", "-0", 1)
		case 1:
			if v >= 0 {
				s = "+" + s
			}
		}
		ints = append(ints, s)
	}
	ints = append(ints, "0", "-0", "+0", "00", "007", " 5", "5 ", "1e3", "0x10", "1_000", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "")

	var nums []string
	for range 150 {
		d := strconv.FormatInt(r.Int64N(1_000_000), 10)
		scale := r.IntN(6)
		if len(d) <= scale {
			d = strings.Repeat("0", scale-len(d)+1) + d
		}
		s := d
		if scale > 0 {
			s = d[:len(d)-scale] + "." + d[len(d)-scale:]
		}
		s += strings.Repeat("0", r.IntN(3)*r.IntN(2))
		if r.IntN(3) == 0 {
			s = pick("-", "+") + s
		}
		if r.IntN(4) == 0 {
			s += pick("e", "E") + pick("", "+", "-") + strconv.Itoa(r.IntN(8))
		}
		if r.IntN(8) == 0 {
			s = pick(" ", "\t", "  ") + s + pick("", " ", "\n")
		}
		nums = append(nums, s)
		if v, err := canonNumeric(s); err == nil && r.IntN(2) == 0 { // the same value, written otherwise
			nums = append(nums, v+pick("", "0", "00"), "0"+v, v+"e0")
		}
	}
	nums = append(nums, "1.50", "1.5", "1.500", "4.0", "4", "-0", "-0.00", "0.000", ".5", "5.", "0.5", "00.50", "1e2", "100", "1E+2", "NaN", "nan", "NAN",
		"Infinity", "-Infinity", "inf", "+inf", "-INF", "infinity", "1e1001", "12345678901234567890.123456789012345678900", "1.2.3", ".", "e5", "1e", "--1", "0x1",
		// Beside and past the size limits, and the padded values the form writes with an exponent.
		"1e20", "1e21", "1e+21", "100000000000000000000", "1000000000000000000000", "1.5e30", "-2.5e-30", "0.000000000000000000001", "0.0000000000000000000001",
		"1e131071", "9.9e131071", "1e131072", "1e-16383", "1e-16384", "1.5e-16383", "1e262144", "-1e-30")

	var floats []string
	for range 150 {
		var v float64
		switch r.IntN(4) {
		case 0:
			v = float64(r.IntN(2000)-1000) / 8
		case 1:
			v = r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20))
		case 2:
			v = math.Float64frombits(r.Uint64())
		default:
			v = float64(float32(r.NormFloat64()))
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			v = 1
		}
		for range 2 {
			floats = append(floats, pick(strconv.FormatFloat(v, 'g', -1, 64), strconv.FormatFloat(v, 'e', 20, 64), strconv.FormatFloat(v, 'f', -1, 64), fmt.Sprintf("%.17g", v), strconv.FormatFloat(v, 'g', -1, 32), strconv.FormatFloat(v, 'E', -1, 64)))
		}
	}
	floats = append(floats, "0", "-0", "0.0", "-0.0", "+0", "1e-320", "-1e-320", "1e-400", "1e400", "NaN", "-nan", "nan", "Infinity", "-Infinity", "inf", "-inf", "+Infinity",
		"0.1", "0.10", "1.0", "1", " 1.5 ", "0x1p3", "0x10", "1_0", "0.30000000000000004", "0.3", "3.4028235e38", "3.4028236e38", "1.17549435e-38", "1e-45", "1.4e-45")

	times := func(zone bool) []string {
		var out []string
		var at time.Time
		for i := range 160 {
			if i%2 == 0 || !zone { // one instant, in two time zones
				at = time.Unix(r.Int64N(4e9)-1e9, r.Int64N(1e9)).UTC()
				if r.IntN(10) == 0 {
					at = at.AddDate(-2100-r.IntN(400), 0, 0) // BC
				}
			}
			off := (r.IntN(29) - 14) * 1800
			if r.IntN(5) == 0 {
				off += r.IntN(60)*60 + r.IntN(60)
				off = max(min(off, 15*3600+59*60+59), -(15*3600 + 59*60 + 59))
			}
			loc := time.FixedZone("", off)
			frac := pick("", ".000", ".000000", ".999999999", ".123456", ".1234565", ".5", ".0000005", ".9999996")
			layout := pick("2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02 15:04")
			s := at.In(loc).Format(layout)
			if strings.Count(layout, ":") == 2 {
				s += frac
			}
			if zone {
				sign, a := "+", off
				if a < 0 {
					sign, a = "-", -a
				}
				hh, mm, ss := a/3600, a/60%60, a%60
				switch {
				case ss != 0:
					s += fmt.Sprintf("%s%02d:%02d:%02d", sign, hh, mm, ss)
				case mm != 0:
					s += pick(fmt.Sprintf("%s%02d:%02d", sign, hh, mm), fmt.Sprintf("%s%02d%02d", sign, hh, mm))
				case off == 0:
					s += pick("Z", "z", "+00", "-00:00", "+0000")
				default:
					s += pick(fmt.Sprintf("%s%02d", sign, hh), fmt.Sprintf("%s%02d:00", sign, hh))
				}
			}
			y := at.In(loc).Year()
			if y <= 0 {
				s = fmt.Sprintf("%04d", 1-y) + s[strings.Index(s[1:], "-")+1:] + " BC"
			}
			out = append(out, s)
		}
		return out
	}
	tstz := append(times(true), "2026-01-02 03:04:05+00", "2026-01-02 05:04:05+02", "2026-01-02T03:04:05Z", "2026-01-02 03:04:05z", "2026-01-02 03:04:05",
		"2026-01-02", "infinity", "-infinity", "Infinity", "epoch", "now", "2026-02-30 00:00:00+00", "2026-01-02 24:00:00+00", "2026-01-02 23:59:60+00",
		"2026-01-02 03:04:05+16", "2026-01-02 03:04:05+15:59:59", "0044-03-15 10:00:00+00 BC", "1800-01-01 05:53:28+05:53:28", "2026-1-2 3:4:5+00", "26-01-02 03:04:05+00",
		"99999-01-01 00:00:00+00", "294276-12-31 23:59:59.999999+00", "294277-01-01 00:00:00+00", "294276-12-31 23:00:00-02", "4714-11-24 00:00:00+00 BC",
		"4714-11-23 23:59:59+00 BC", "4714-11-24 00:00:00+01 BC", "999999999-01-01 00:00:00+00")
	ts := append(times(false), "2026-01-02 03:04:05", "2026-01-02T03:04:05.5", "2026-01-02", "2026-01-02 03:04:05+02", "infinity", "-infinity", "0001-01-01 00:00:00 BC", "10000-01-01 00:00:00",
		"294276-12-31 23:59:59", "294277-01-01 00:00:00", "4714-11-24 00:00:00 BC", "4714-11-23 00:00:00 BC")
	var dates []string
	for range 80 {
		at := time.Unix(r.Int64N(6e10)-3e10, 0).UTC()
		s := at.Format("2006-01-02")
		if at.Year() <= 0 {
			s = fmt.Sprintf("%04d", 1-at.Year()) + at.Format("-01-02") + " BC"
		}
		dates = append(dates, s)
	}
	dates = append(dates, "2026-01-02", "2026-1-2", "2026-01-02 03:04:05", "2026-02-29", "2024-02-29", "0000-01-01", "0001-01-01 BC", "infinity", "-infinity", "1/2/2026", "20260102", "January 2, 2026",
		"5874897-12-31", "5874898-01-01", "4714-11-24 BC", "4714-11-23 BC", "999999999-01-01")

	var ivs []string
	units := []string{"year", "years", "mon", "mons", "month", "months", "week", "weeks", "day", "days", "hour", "hours", "minute", "minutes", "min", "mins", "second", "seconds", "sec", "secs", "millisecond", "milliseconds", "microsecond", "microseconds"}
	for range 150 {
		var p []string
		for range 1 + r.IntN(3) {
			p = append(p, fmt.Sprintf("%s%d %s", pick("", "", "-", "+"), r.IntN(100), units[r.IntN(len(units))]))
		}
		if r.IntN(2) == 0 {
			p = append(p, fmt.Sprintf("%s%02d:%02d%s", pick("", "-", "+"), r.IntN(48), r.IntN(60), pick("", fmt.Sprintf(":%02d", r.IntN(60)), fmt.Sprintf(":%02d.%d", r.IntN(60), r.IntN(1000000)))))
		}
		ivs = append(ivs, strings.Join(p, " "))
		d, h := r.IntN(100), r.IntN(24)
		ivs = append(ivs, fmt.Sprintf("%d days %02d:00:00", d, h), fmt.Sprintf("%d:00:00", d*24+h), fmt.Sprintf("%d hours", d*24+h))
		if d%30 == 0 {
			ivs = append(ivs, fmt.Sprintf("%d mons %d hours", d/30, h))
		}
	}
	ivs = append(ivs, "1 mon", "30 days", "720:00:00", "1 day", "24:00:00", "24 hours", "-1 days +02:00:00", "1 year 2 mons -3 days +04:05:06.5", "00:00:00", "0 days", "-00:00:01",
		"90 minutes", "01:30", "1.5 days", "1 day ago", "@ 1 day", "P1D", "1 fortnight", "00:00:00.0000005", "00:00:00.1234565",
		// Beside and past the fields' ranges.
		"2147483647 days", "2147483648 days", "-2147483648 days", "99999999999999999999 days", "178956970 years", "178956971 years", "2147483647 mons",
		"2147483647 days 1 day -1 day", "2562047788:00:00", "2562047789:00:00", "9223372036854775807 microseconds", "9223372036854775808 microseconds")

	var inets []string
	for range 150 {
		var a []byte
		if r.IntN(2) == 0 {
			a = make([]byte, 4)
		} else {
			a = make([]byte, 16)
			switch r.IntN(4) {
			case 0: // runs of zero words
				for i := 0; i < 16; i += 2 {
					if r.IntN(2) == 0 {
						a[i], a[i+1] = byte(r.IntN(3)), byte(r.IntN(256))
					}
				}
			case 1: // v4-mapped and v4-compatible
				if r.IntN(2) == 0 {
					a[10], a[11] = 0xff, 0xff
				}
				for i := 12; i < 16; i++ {
					a[i] = byte(r.IntN(256))
				}
			case 2:
				for i := 12; i < 16; i++ {
					a[i] = byte(r.IntN(3))
				}
			default:
				for i := range a {
					a[i] = byte(r.IntN(256))
				}
			}
		}
		var s string
		if len(a) == 4 {
			s = fmt.Sprintf("%d.%d.%d.%d", a[0], a[1], a[2], a[3])
		} else {
			var w []string
			for i := 0; i < 16; i += 2 {
				w = append(w, fmt.Sprintf(pick("%x", "%04x", "%X"), int(a[i])<<8|int(a[i+1])))
			}
			s = strings.Join(w, ":")
		}
		if r.IntN(2) == 0 {
			s += "/" + strconv.Itoa(r.IntN(8*len(a)+1))
		}
		inets = append(inets, s)
	}
	inets = append(inets, "10.0.0.1", "10.0.0.1/32", "10.0.0.0/8", "10.1/16", "010.0.0.1", "::1", "::1/128", "::ffff:1.2.3.4", "::1.2.3.4", "::0.0.0.2", "::ffff:0:1.2.3.4",
		"0:0:0:0:0:1:2:3", "1:0:0:1:0:0:0:1", "1:0:0:0:1:0:0:1", "FE80::1", "fe80::1%eth0", "1::", "::", "0.0.0.0/0", "::/0", "192.168.1.5/24", "10.0.0.0", "1.2.3.4/33")

	var byteas []string
	for range 100 {
		b := make([]byte, r.IntN(8))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		switch r.IntN(3) {
		case 0:
			byteas = append(byteas, `\x`+hex.EncodeToString(b))
		case 1:
			byteas = append(byteas, `\x`+strings.ToUpper(hex.EncodeToString(b)))
		default:
			var s strings.Builder
			for _, c := range b {
				switch {
				case c == '\\':
					s.WriteString(`\\`)
				case c >= 0x20 && c < 0x7f && r.IntN(2) == 0:
					s.WriteByte(c)
				default:
					fmt.Fprintf(&s, `\%03o`, c)
				}
			}
			byteas = append(byteas, s.String())
		}
	}
	byteas = append(byteas, `\x0102ff`, `\x0102FF`, `\x01 02`, `\x012`, `abc`, `a\\b`, `\001`, `\400`, `\x`, ``, `\xzz`, `a\b`)

	var uuids []string
	for range 60 {
		h := fmt.Sprintf("%016x%016x", r.Uint64(), r.Uint64())
		switch r.IntN(4) {
		case 0:
			uuids = append(uuids, h[:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:])
		case 1:
			uuids = append(uuids, strings.ToUpper(h))
		case 2:
			uuids = append(uuids, "{"+h[:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:]+"}")
		default:
			uuids = append(uuids, h[:4]+"-"+h[4:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:24]+"-"+h[24:28]+"-"+h[28:])
		}
	}
	uuids = append(uuids, "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "{a0eebc999c0b4ef8bb6d6bb9bd380a11}", "a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11",
		"a0eebc999c0b4ef8bb6d6bb9bd380a1", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11-", "{a0eebc999c0b4ef8bb6d6bb9bd380a11")

	// Letters of many scripts and both cases, with the ones whose case
	// mapping is special: dotted and dotless i, final sigma, sharp s, the
	// Kelvin sign, a supplementary plane (Deseret), title case, and
	// combining marks.
	alphabet := []rune("aAbBzZ09 _-.@" + "éÉàÀçÇñÑøØåÅæÆ" + "ıIİiẞßſ" + "σΣςΑαΩωΐ" + "дДяЯёЁ" + "ǅǄǆ" + "KkÅ" + "ⅠⅰⒶⓐＡａ" + "𐐀𐐨" + "\u0301\u0307" + "ԱաႠⴀ")
	var texts []string
	for range 200 {
		var b strings.Builder
		for range 1 + r.IntN(8) {
			b.WriteRune(alphabet[r.IntN(len(alphabet))])
		}
		s := b.String()
		mixed := []rune(s)
		for i := range mixed {
			if r.IntN(2) == 0 {
				mixed[i] = []rune(strings.ToUpper(string(mixed[i])))[0]
			}
		}
		texts = append(texts, s, strings.ToUpper(s), strings.ToLower(s), string(mixed))
	}
	texts = append(texts, "Alice@Example.com", "alice@example.com", "ALICE@EXAMPLE.COM", "ΣΑΣ", "σας", "σασ", "İstanbul", "istanbul", "STRASSE", "straße", "ab", "ab  ", " ab")
	var padded []string
	for range 60 {
		s := texts[r.IntN(len(texts))]
		padded = append(padded, s+strings.Repeat(" ", r.IntN(4)))
	}
	padded = append(padded, "ab", "ab ", "ab   ", "ab      ", " ab", "ab\t", "")

	return []formCase{
		{"smallint", ints, ""}, {"integer", ints, ""}, {"bigint", ints, ""},
		{"numeric", nums, ""},
		{"real", floats, ""}, {"double precision", floats, ""},
		{"timestamp with time zone", tstz, ""}, {"timestamp", ts, ""}, {"date", dates, ""},
		{"interval", ivs, ""},
		{"inet", inets, ""}, {"cidr", inets, ""},
		{"bytea", byteas, ""},
		{"uuid", uuids, ""},
		{"character(5)", padded, "bpchar"}, {"text", padded, ""},
		{"public.citext", texts, ""},
	}
}

// ruleOf returns the rule of a column of typ, through a table made for
// it.
func ruleOf(t *testing.T, c *pgx.Conn, typ string) *keyRule {
	t.Helper()
	ctx := context.Background()
	name := "form_" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, typ)
	if _, err := c.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (k %s)`, name, typ)); err != nil {
		t.Fatal(err)
	}
	r, err := resolve(ctx, c, name)
	if err != nil {
		t.Fatal(err)
	}
	rule, err := readKeyRule(ctx, c, r, "k", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rule
}

// TestKeyFormsAgreeWithServer checks every canonical form against the
// server's reading of the same texts: for every text the server reads, a
// canonical form the function gives is the server's value's, and for
// every pair the server reads, the server's equality is the forms'. The
// server's own output of each value is read back, and is equal to the
// value.
func TestKeyFormsAgreeWithServer(t *testing.T) {
	c, _ := pgConn(t)
	ensureCitext(t, c)
	ctx := context.Background()
	// The forms the followers pin, for the session; and citext's
	// operators, in public, visible.
	if _, err := c.Exec(ctx, `SELECT set_config('search_path', current_schema() || ', public', false)`); err != nil {
		t.Fatal(err)
	}
	for _, q := range strings.Split(strings.ReplaceAll(streamForms, "SET LOCAL", "SET"), ";") {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	seed := testrand.Seed(t)
	var nTexts, read, declined, pairsAll, disagree int
	defer func() {
		t.Logf("all types: %d texts, %d that the server reads, %d of them that key declines; %d pairs, %d disagreements", nTexts, read, declined, pairsAll, disagree)
	}()
	for _, fc := range keyFormCases(seed) {
		t.Run(fc.typ, func(t *testing.T) {
			rule := ruleOf(t, c, fc.typ)
			cast := cmp.Or(fc.cast, fc.typ)
			type value struct{ text, out, form string }
			var vals []value
			rejected, refused := 0, 0
			for _, s := range fc.texts {
				var out string
				err := c.QueryRow(ctx, fmt.Sprintf(`SELECT format('%%s', $1::text::%s)`, cast), s).Scan(&out)
				if err != nil {
					rejected++
					continue // the server reads no value: any answer is right
				}
				form, err := rule.fromServer(out)
				if err != nil {
					t.Errorf("the server printed %q for %q, which fromServer refuses: %v", out, s, err)
					continue
				}
				if again, err := rule.key(out); err != nil || again != form {
					t.Errorf("key(%q) = %q, %v; want %q, the form of the server's own output", out, again, err, form)
				}
				if again, err := rule.key(form); err != nil || again != form {
					t.Errorf("key(%q) = %q, %v; want it unchanged: the form is its own form", form, again, err)
				}
				var same bool
				if err := c.QueryRow(ctx, fmt.Sprintf(`SELECT $1::text::%s = $2::text::%[1]s`, cast), form, out).Scan(&same); err != nil || !same {
					t.Errorf("the server does not read the form %q as the value %q it came from (%v, %v): a store lookup by the form would miss", form, out, same, err)
				}
				k, err := rule.key(s)
				switch {
				case err != nil:
					refused++ // the guard cannot judge it: the lookup goes to the store
				case k != form:
					t.Errorf("key(%q) = %q, but the server reads it as %q, whose form is %q: a wrong 404", s, k, out, form)
				}
				vals = append(vals, value{s, out, form})
			}
			// Every pair: the server's equality is the forms'.
			texts := make([]string, len(vals))
			for i, v := range vals {
				texts[i] = v.text
			}
			rows, err := c.Query(ctx, fmt.Sprintf(`SELECT i, j, a::%s = b::%[1]s FROM unnest($1::text[]) WITH ORDINALITY u(a, i), unnest($1::text[]) WITH ORDINALITY v(b, j) WHERE i < j`, cast), texts)
			if err != nil {
				t.Fatal(err)
			}
			np, equal, nd := 0, 0, 0
			for rows.Next() {
				var i, j int
				var eq bool
				if err := rows.Scan(&i, &j, &eq); err != nil {
					t.Fatal(err)
				}
				a, b := vals[i-1], vals[j-1]
				np++
				if eq {
					equal++
				}
				if eq != (a.form == b.form) {
					nd++
					t.Errorf("the server says %q = %q is %v; their forms are %q and %q", a.text, b.text, eq, a.form, b.form)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d texts: %d read by the server, %d of them refused by key (the store decides); %d pairs, %d equal", fc.typ, len(fc.texts), len(vals), refused, np, equal)
			nTexts, read, declined = nTexts+len(fc.texts), read+len(vals), declined+refused
			pairsAll, disagree = pairsAll+np, disagree+nd
			if len(vals)-refused < len(vals)/2 {
				t.Errorf("key refused %d of the %d texts the server reads: the guard would judge too few lookups", refused, len(vals))
			}
			_ = rejected
		})
	}
}

// TestCitextFormMatchesLowerOnServer checks the citext form against the
// server's lower() for every code point (one text of all of them) and for
// random strings: citext compares lower() of both sides.
func TestCitextFormMatchesLowerOnServer(t *testing.T) {
	c, _ := pgConn(t)
	ensureCitext(t, c)
	ctx := context.Background()
	rule := ruleOf(t, c, "public.citext")
	var all strings.Builder
	for cp := rune(1); cp <= utf8.MaxRune; cp++ {
		if cp < 0xd800 || cp > 0xdfff {
			all.WriteRune(cp)
		}
	}
	var want string
	if err := c.QueryRow(ctx, `SELECT lower($1::text COLLATE "default")`, all.String()).Scan(&want); err != nil {
		t.Fatal(err)
	}
	got, err := rule.key(all.String())
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		for i := 0; i < min(len(got), len(want)); i++ {
			if got[i] != want[i] {
				t.Fatalf("the form of every code point differs from the server's lower() at byte %d: %q, want %q", i, got[max(i-8, 0):min(i+8, len(got))], want[max(i-8, 0):min(i+8, len(want))])
			}
		}
		t.Fatalf("the form of every code point is %d bytes, the server's lower() %d", len(got), len(want))
	}
}

// TestKeyFormsIPv6 checks formatIPv6 against the server's output for
// addresses of every shape of zero runs.
func TestKeyFormsIPv6(t *testing.T) {
	c, _ := pgConn(t)
	ctx := context.Background()
	var in []string
	for mask := range 256 {
		for _, v4 := range []bool{false, true} {
			var a [16]byte
			for w := range 8 {
				if mask>>w&1 == 1 {
					a[2*w+1] = byte(w + 1)
				}
			}
			if v4 {
				a[10], a[11] = 0xff, 0xff
			}
			in = append(in, formatGo(a))
		}
	}
	rows, err := c.Query(ctx, `SELECT a, format('%s', a::inet) FROM unnest($1::text[]) a`, in)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var a, want string
		if err := rows.Scan(&a, &want); err != nil {
			t.Fatal(err)
		}
		got, err := canonInet(false)(a)
		if err != nil || got != want {
			t.Errorf("canonInet(%q) = %q, %v; the server prints %q", a, got, err, want)
		}
		n++
	}
	if rows.Err() != nil || n != len(in) {
		t.Fatalf("%d of %d rows: %v", n, len(in), rows.Err())
	}
}

// formatGo writes a in full, eight words.
func formatGo(a [16]byte) string {
	var w []string
	for i := 0; i < 16; i += 2 {
		w = append(w, fmt.Sprintf("%x", int(a[i])<<8|int(a[i+1])))
	}
	return strings.Join(w, ":")
}

// TestKeyFormsWithoutServer pins the forms of the examples, and
// the texts each form refuses, without a server.
func TestKeyFormsWithoutServer(t *testing.T) {
	lower := &lowerMap{runes: map[rune]string{'A': "a", 'E': "e", 'C': "c", 'X': "x", 'M': "m", 'P': "p", 'L': "l", 'É': "é"}}
	for c := range lower.keep {
		lower.keep[c] = !strings.ContainsRune("AECXMPL", rune(c))
	}
	tests := []struct {
		name string
		form func(string) (string, error)
		in   string
		want string // "" for an error
	}{
		{"char(5) padding", canonBpchar, "ab   ", "ab"},
		{"char(5) short", canonBpchar, "ab", "ab"},
		{"citext e-mail", lower.canon, "Alice@Example.com", "alice@example.com"},
		{"citext non-ASCII", lower.canon, "Émile", "émile"},
		{"citext not UTF-8", lower.canon, "A\xff", ""},
		{"numeric scale", canonNumeric, "1.50", "1.5"},
		{"numeric integer", canonNumeric, "4.0", "4"},
		{"numeric zero", canonNumeric, "-0.00", "0"},
		{"numeric exponent", canonNumeric, "1.5e3", "1500"},
		{"numeric small", canonNumeric, "15e-4", "0.0015"},
		{"numeric nan", canonNumeric, "nan", "NaN"},
		{"numeric bad", canonNumeric, "1.2.3", ""},
		{"numeric huge exponent", canonNumeric, "1e999999999", ""},
		{"numeric padded", canonNumeric, "1e20", "100000000000000000000"},
		{"numeric exponent form", canonNumeric, "1000000000000000000000000", "1e+24"},
		{"numeric exponent form small", canonNumeric, "-0.0000000000000000000000015", "-1.5e-24"},
		{"numeric largest", canonNumeric, "1e131071", "1e+131071"},
		{"numeric too large", canonNumeric, "1e131072", ""},
		{"numeric too small a scale", canonNumeric, "1.5e-16383", ""},
		{"numeric attack", canonNumeric, "1e262144", ""},
		{"timestamptz year 99999", canonTime(kindTimestamptz), "99999-01-01 00:00:00+00", "99999-01-01 00:00:00+00"},
		{"timestamptz past the end", canonTime(kindTimestamptz), "294277-01-01 00:00:00+00", ""},
		{"timestamptz before the first", canonTime(kindTimestamptz), "4714-11-24 00:00:00+01 BC", ""},
		{"date past the end", canonTime(kindDate), "5874898-01-01", ""},
		{"interval days out of range", canonInterval, "2147483648 days", ""},
		{"interval years out of range", canonInterval, "178956971 years", ""},
		{"interval attack", canonInterval, "99999999999999999999 days", ""},
		{"float -0", canonFloat(64), "-0", "0"},
		{"float scale", canonFloat(64), "0.10", "0.1"},
		{"float hex", canonFloat(64), "0x1p3", ""},
		{"real", canonFloat(32), "0.1", "0.1"},
		{"timestamptz offset", canonTime(kindTimestamptz), "2026-01-02T05:04:05+02:00", "2026-01-02 03:04:05+00"},
		{"timestamptz no offset", canonTime(kindTimestamptz), "2026-01-02 03:04:05", ""},
		{"timestamptz BC", canonTime(kindTimestamptz), "0044-03-15 10:00:00+00 BC", "0044-03-15 10:00:00+00 BC"},
		{"timestamp fraction", canonTime(kindTimestamp), "2026-01-02 03:04:05.500", "2026-01-02 03:04:05.5"},
		{"timestamp with offset", canonTime(kindTimestamp), "2026-01-02 03:04:05+02", ""},
		{"date", canonTime(kindDate), "2026-1-2", "2026-01-02"},
		{"date no such day", canonTime(kindDate), "2026-02-30", ""},
		{"interval month", canonInterval, "1 mon", "30 days"},
		{"interval hours", canonInterval, "36:00:00", "1 days 12:00:00"},
		{"interval negative", canonInterval, "-1 days +02:00:00", "-22:00:00"},
		{"interval fraction", canonInterval, "1.5 days", ""},
		{"interval sign of the session", canonInterval, "-1 days 02:00:00", ""},
		{"interval signed fields", canonInterval, "-1 days -02:00:00", "-1 days -02:00:00"},
		{"inet host /32", canonInet(false), "10.0.0.1/32", "10.0.0.1"},
		{"inet v6 case", canonInet(false), "FE80::1", "fe80::1"},
		{"inet leading zero", canonInet(false), "010.0.0.1", ""},
		{"cidr", canonInet(true), "10.0.0.0/8", "10.0.0.0/8"},
		{"cidr host bits", canonInet(true), "10.0.0.1/8", ""},
		{"cidr host", canonInet(true), "10.0.0.0", "10.0.0.0/32"},
		{"cidr abbreviated", canonInet(true), "10.1/16", ""},
		{"bytea upper", canonBytea, `\x0102FF`, `\x0102ff`},
		{"bytea escape", canonBytea, `a\\\001`, `\x615c01`},
		{"bytea bad escape", canonBytea, `a\b`, ""},
		{"uuid upper", canonUUID, "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
		{"uuid braces", canonUUID, "{a0eebc999c0b4ef8bb6d6bb9bd380a11}", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
		{"uuid short", canonUUID, "a0eebc99", ""},
		{"bigint leading zeros", canonInt(64), "007", "7"},
		{"bigint minus zero", canonInt(64), "-0", "0"},
		{"bigint spaces", canonInt(64), " 7", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.form(tt.in)
			switch {
			case tt.want == "" && err == nil:
				t.Errorf("form(%q) = %q, want an error", tt.in, got)
			case tt.want != "" && (err != nil || got != tt.want):
				t.Errorf("form(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

// FuzzKeyForms feeds every form arbitrary text: none panics, each result
// is its own form, and its size is bounded by the input's.
func FuzzKeyForms(f *testing.F) {
	for _, fc := range keyFormCases(1) {
		for _, s := range fc.texts {
			f.Add(s)
		}
	}
	lower := &lowerMap{runes: map[rune]string{'A': "a", 'Σ': "σ", 'İ': "i̇"}}
	for c := range lower.keep {
		lower.keep[c] = c != 'A'
	}
	forms := map[string]func(string) (string, error){
		"int": canonInt(64), "bpchar": canonBpchar, "citext": lower.canon, "numeric": canonNumeric, "float8": canonFloat(64), "float4": canonFloat(32),
		"timestamptz": canonTime(kindTimestamptz), "timestamp": canonTime(kindTimestamp), "date": canonTime(kindDate), "interval": canonInterval,
		"inet": canonInet(false), "cidr": canonInet(true), "inetServer": inetFromServer, "bytea": canonBytea, "uuid": canonUUID,
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, form := range forms {
			got, err := form(s)
			if err != nil {
				continue
			}
			if again, err := form(got); err != nil || again != got {
				t.Errorf("%s: form(%q) = %q, whose form is %q, %v", name, s, got, again, err)
			}
			// The bound of every form: three bytes a byte (citext's
			// lower() can lengthen a code point so; bytea's hex doubles
			// a raw byte) and 64 for a type's fixed parts (an
			// exponent, a uuid's hyphens, a timestamp's fields).
			if len(got) > 3*len(s)+64 {
				t.Errorf("%s: form(%q) is %d bytes, over 3×%d+64", name, s, len(got), len(s))
			}
		}
	})
}
