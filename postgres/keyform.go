package postgres

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The canonical text forms of keys: for each key type whose equality is
// not its text's, a function from any text the database reads as a value
// of the type to one text per value under the type's equality. Each is
// used on both sides: on the texts the server prints (the read, the
// change stream, the NOTIFY trigger's ::text), and on the texts an
// application looks keys up with (Follower.Key). Where a function cannot
// tell which value the server would read a text as (a form the server
// accepts that it does not parse, a setting of the caller's session that
// decides it), it returns an error and never a guess: the caller passes
// the lookup on to the store. The tests check each one against the server
// (keyform_test.go).

// errKeyForm wraps the errors of the canonical forms.
var errKeyForm = errors.New("not a form the guard can read")

func formErr(typ, s string, why string) error {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return fmt.Errorf("%w: %s %q: %s", errKeyForm, typ, s, why)
}

// pgSpace reports whether c is a space as the server's input functions
// skip it (C's isspace).
func pgSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// trimPGSpace returns s without leading and trailing pgSpace.
func trimPGSpace(s string) string {
	for len(s) > 0 && pgSpace(s[0]) {
		s = s[1:]
	}
	for len(s) > 0 && pgSpace(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

// digits reports whether s is one or more ASCII digits.
func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// --- integers ---------------------------------------------------------

// canonInt returns the canonical form of an integer of bits bits: its
// decimal digits, without sign for 0 and leading zeros. It reads what
// strconv.ParseInt reads (an optional sign, decimal digits); the server
// also skips spaces, which the function refuses.
func canonInt(bits int) func(string) (string, error) {
	// The most digits any value of the type has, less one: a text of
	// fewer is in range without parsing.
	short := map[int]int{16: 4, 32: 9, 64: 18}[bits]
	return func(s string) (string, error) {
		if plainInt(s, short) {
			return s, nil // the server's own form: no parse, no allocation
		}
		v, err := strconv.ParseInt(s, 10, bits)
		if err != nil {
			return "", formErr("integer", s, "want decimal digits in range")
		}
		return strconv.FormatInt(v, 10), nil
	}
}

// plainInt reports whether s is an integer in canonical form (no "+",
// no leading zeros, no "-0") of at most short digits.
func plainInt(s string, short int) bool {
	t := s
	if len(t) > 0 && t[0] == '-' {
		t = t[1:]
	}
	if t == "" || len(t) > short || t[0] == '0' && (len(t) > 1 || len(t) < len(s)) {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] < '0' || t[i] > '9' {
			return false
		}
	}
	return true
}

// --- character(n) -------------------------------------------------------

// canonBpchar returns s without trailing spaces: character(n) compares
// without them ("ab" = "ab   "), and prints them up to n.
func canonBpchar(s string) (string, error) {
	return strings.TrimRight(s, " "), nil
}

// --- citext -----------------------------------------------------------

// lowerMap is the server's lower() of the database's default collation,
// per code point: the texts it changes, and for ASCII whether it keeps
// the byte. citext compares the lower() of both sides, under the
// database's default collation whatever the column's, byte by byte; with
// libc (or C) as that collation's provider, lower() maps each code point
// alone, so applying the map per code point is the server's lower().
type lowerMap struct {
	keep  [utf8.RuneSelf]bool // an ASCII byte that lower() keeps
	runes map[rune]string
}

func (m *lowerMap) canon(s string) (string, error) {
	i := 0
	for ; i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf || !m.keep[c] {
			break
		}
	}
	if i == len(s) {
		return s, nil
	}
	if !utf8.ValidString(s) {
		return "", formErr("citext", s, "not UTF-8")
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for _, r := range s[i:] {
		if l, ok := m.runes[r]; ok {
			b.WriteString(l)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String(), nil
}

// --- numeric -----------------------------------------------------------

// The server's numeric holds up to 131072 digits before the point and
// 16383 after it, and refuses a text beyond them ("value overflows
// numeric format"); canonNumeric refuses it too. maxNumericExp bounds the
// exponent it reads before it looks at the digits.
const (
	maxNumericWeight = 131072 // digits before the point
	maxNumericScale  = 16383  // digits after it
	maxNumericExp    = 1 << 18
	// maxNumericPad is the most zeros the canonical form writes that
	// the digits do not: a value whose decimal text would take more is
	// written with an exponent, so that a key's form is never much
	// longer than its text (1e131071 would be 131072 bytes).
	maxNumericPad = 20
)

// canonNumeric returns the canonical form of a numeric: its value in
// decimal, without a sign for 0, leading zeros or trailing fractional
// zeros ("1.50" and "1.5e0" are "1.5", "-0.00" is "0"), and "NaN",
// "Infinity", "-Infinity". numeric compares values, not scales: 1.50 =
// 1.5. A value whose decimal text would hold more than maxNumericPad
// zeros that are not among its significant digits is written as its
// digits with an exponent ("1e+30", "1.5e-40"), whichever text it came
// as: the form is at most about as long as the shortest text of the
// value, never 30,000 times a request's size. It reads what numeric_in
// reads, but for the underscores and non-decimal integers of PostgreSQL
// 16, and refuses what numeric_in refuses for its size.
func canonNumeric(s string) (string, error) {
	if plainNumeric(s) {
		return s, nil
	}
	t := trimPGSpace(s)
	switch strings.ToLower(t) {
	case "nan":
		return "NaN", nil
	case "infinity", "+infinity", "inf", "+inf":
		return "Infinity", nil
	case "-infinity", "-inf":
		return "-Infinity", nil
	}
	neg := false
	if t != "" && (t[0] == '+' || t[0] == '-') {
		neg = t[0] == '-'
		t = t[1:]
	}
	mant, exp := t, ""
	if i := strings.IndexAny(t, "eE"); i >= 0 {
		mant, exp = t[:i], t[i+1:]
	}
	intPart, frac, dot := strings.Cut(mant, ".")
	if !(digits(intPart) || intPart == "" && dot) || !(digits(frac) || frac == "" && intPart != "") {
		return "", formErr("numeric", s, "want [sign]digits[.digits][e[sign]digits]")
	}
	e := 0
	if i := strings.IndexAny(t, "eE"); i >= 0 {
		es := exp
		if es != "" && (es[0] == '+' || es[0] == '-') {
			es = es[1:]
		}
		v, err := strconv.Atoi(exp)
		if !digits(es) || err != nil || v > maxNumericExp || v < -maxNumericExp {
			return "", formErr("numeric", s, "bad exponent")
		}
		e = v
	}
	// The value is 0.d × 10^point.
	d := intPart + frac
	point := len(intPart) + e
	for d != "" && d[0] == '0' {
		d, point = d[1:], point-1
	}
	d = strings.TrimRight(d, "0")
	if d == "" {
		return "0", nil
	}
	if point > maxNumericWeight || len(d)-point > maxNumericScale {
		return "", formErr("numeric", s, "value overflows numeric format")
	}
	var b strings.Builder
	b.Grow(len(d) + 8 + min(max(point-len(d), -point, 0), maxNumericPad))
	if neg {
		b.WriteByte('-')
	}
	switch {
	case max(point-len(d), -point) > maxNumericPad:
		// d[0].d[1:] × 10^(point-1)
		b.WriteString(d[:1])
		if len(d) > 1 {
			b.WriteByte('.')
			b.WriteString(d[1:])
		}
		b.WriteString("e")
		if point > 0 {
			b.WriteByte('+')
		}
		b.WriteString(strconv.Itoa(point - 1))
	case point <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -point))
		b.WriteString(d)
	case point >= len(d):
		b.WriteString(d)
		b.WriteString(strings.Repeat("0", point-len(d)))
	default:
		b.WriteString(d[:point])
		b.WriteByte('.')
		b.WriteString(d[point:])
	}
	return b.String(), nil
}

// plainNumeric reports whether s is a numeric in canonical form: the
// server's own output but for trailing fractional zeros, with at most
// maxNumericPad zeros before the digits of a fraction under 1 or after
// those of an integer.
func plainNumeric(s string) bool {
	t := strings.TrimPrefix(s, "-")
	intPart, frac, dot := strings.Cut(t, ".")
	switch {
	case !digits(intPart) || intPart[0] == '0' && len(intPart) > 1:
		return false
	case dot:
		return digits(frac) && frac[len(frac)-1] != '0' &&
			(intPart != "0" || len(frac)-len(strings.TrimLeft(frac, "0")) <= maxNumericPad) &&
			len(frac) <= maxNumericScale && len(intPart) <= maxNumericWeight
	default:
		return (t != "0" || t == s) && // "-0" is not
			len(t)-len(strings.TrimRight(t, "0")) <= maxNumericPad && len(t) <= maxNumericWeight
	}
}

// --- real, double precision ----------------------------------------------

// canonFloat returns the canonical form of a float of bits bits: the
// shortest decimal that reads back as the value (strconv's 'g'), "0" for
// both zeros (-0 = 0), "NaN" (NaN = NaN), "Infinity", "-Infinity". It
// refuses the hexadecimal forms that the server's strtod also reads.
func canonFloat(bits int) func(string) (string, error) {
	name := "double precision"
	if bits == 32 {
		name = "real"
	}
	return func(s string) (string, error) {
		t := trimPGSpace(s)
		switch strings.ToLower(t) {
		case "nan", "+nan", "-nan":
			return "NaN", nil
		case "infinity", "+infinity", "inf", "+inf":
			return "Infinity", nil
		case "-infinity", "-inf":
			return "-Infinity", nil
		}
		if strings.ContainsAny(t, "_xXpPnNiI") {
			return "", formErr(name, s, "want a decimal number")
		}
		v, err := strconv.ParseFloat(t, bits)
		if err != nil {
			return "", formErr(name, s, "want a decimal number in range")
		}
		if v == 0 {
			return "0", nil
		}
		return strconv.FormatFloat(v, 'g', -1, bits), nil
	}
}

// --- date, timestamp, timestamp with time zone --------------------------

// timeKind is which of the date and time types a text is.
type timeKind int

const (
	kindDate timeKind = iota
	kindTimestamp
	kindTimestamptz
)

func (k timeKind) String() string {
	return [...]string{"date", "timestamp", "timestamp with time zone"}[k]
}

// canonTime returns the canonical form of a date, timestamp or timestamp
// with time zone: the server's ISO output with TimeZone UTC
// ("2026-01-02", "2026-01-02 03:04:05.5", "2026-01-02 03:04:05.5+00",
// " BC" after a year before 1, "infinity", "-infinity"). A timestamp with
// time zone is an instant: every offset of one instant is one key. It
// reads the ISO 8601 forms (a "T" or a space between date and time,
// "Z", "+hh", "+hh:mm", "+hhmm", "+hh:mm:ss" offsets), and refuses what
// depends on the session that looks the key up (a timestamp with time
// zone without an offset: the session's TimeZone decides) or that the
// server reads loosely (a date with a time, a timestamp with an offset,
// other date orders, words such as "today").
func canonTime(kind timeKind) func(string) (string, error) {
	return func(s string) (string, error) {
		t := trimPGSpace(s)
		switch strings.ToLower(t) {
		case "infinity", "+infinity":
			return "infinity", nil
		case "-infinity":
			return "-infinity", nil
		}
		bad := func(why string) (string, error) { return "", formErr(kind.String(), s, why) }
		bc := false
		if n := len(t); n > 3 && strings.EqualFold(t[n-3:], " bc") {
			bc, t = true, t[:n-3]
		}
		// The date: a year of four digits or more, month and day of one
		// or two.
		ys, rest, _ := strings.Cut(t, "-")
		ms, rest, _ := strings.Cut(rest, "-")
		end := 0
		for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
			end++
		}
		ds, rest := rest[:end], rest[end:]
		if !digits(ys) || len(ys) < 4 || len(ys) > 4 && ys[0] == '0' || len(ys) > 9 ||
			!digits(ms) || len(ms) > 2 || !digits(ds) || len(ds) > 2 {
			return bad("want yyyy-mm-dd")
		}
		y, _ := strconv.Atoi(ys)
		mo, _ := strconv.Atoi(ms)
		d, _ := strconv.Atoi(ds)
		if bc {
			if y == 0 {
				return bad("year 0 BC")
			}
			y = 1 - y
		}
		if mo < 1 || mo > 12 || d < 1 || d > daysIn(y, time.Month(mo)) {
			return bad("no such date")
		}
		at := time.Date(y, time.Month(mo), d, 0, 0, 0, 0, time.UTC)
		if kind == kindDate {
			if rest != "" {
				return bad("a date with more than a date")
			}
			if at.Before(firstTime) || !at.Before(dateEnd) {
				return bad("date out of range")
			}
			return formatTime(kind, at), nil
		}
		if rest != "" {
			if rest[0] != ' ' && rest[0] != 'T' && rest[0] != 't' {
				return bad("want a space or T before the time")
			}
			var zone string
			var hasZone bool
			clock := rest[1:]
			if i := strings.IndexAny(clock, "+-zZ"); i >= 0 {
				clock, zone, hasZone = clock[:i], clock[i:], true
			}
			us, ok := clockMicros(clock, 23)
			if !ok {
				return bad("want hh:mm[:ss[.fraction]]")
			}
			at = at.Add(time.Duration(us) * time.Microsecond)
			if hasZone {
				if kind == kindTimestamp {
					return bad("an offset, which the server ignores for a timestamp without time zone")
				}
				off, ok := zoneSeconds(zone)
				if !ok {
					return bad("want an offset Z, +hh, +hh:mm, +hhmm or +hh:mm:ss, up to 15 hours")
				}
				at = at.Add(-time.Duration(off) * time.Second)
			}
			if kind == kindTimestamptz && !hasZone {
				return bad("no offset: the looking-up session's TimeZone would decide the instant")
			}
		} else if kind == kindTimestamptz {
			return bad("no time and offset: the looking-up session's TimeZone would decide the instant")
		}
		if at.Before(firstTime) || !at.Before(timestampEnd) {
			return bad("timestamp out of range")
		}
		return formatTime(kind, at), nil
	}
}

// The server's range of dates and timestamps (a timestamp with time
// zone's in UTC): from 4714-11-24 BC (Julian day 0) to the day before
// dateEnd, or before timestampEnd. A text outside it is refused.
var (
	firstTime    = time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)
	dateEnd      = time.Date(5874898, time.January, 1, 0, 0, 0, 0, time.UTC)
	timestampEnd = time.Date(294277, time.January, 1, 0, 0, 0, 0, time.UTC)
)

// daysIn returns the days of month m of year y (proleptic Gregorian, year
// 0 is 1 BC), as the server counts them.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// clockMicros reads "hh:mm[:ss[.fraction]]" with two-digit fields (hours
// up to maxHour) into microseconds. A fraction is rounded to
// microseconds as the server rounds it: rint(strtod(".fraction") * 1e6).
func clockMicros(s string, maxHour int) (int64, bool) {
	hs, rest, ok := strings.Cut(s, ":")
	if !ok || len(hs) != 2 || !digits(hs) {
		return 0, false
	}
	ms, secs, hasSec := strings.Cut(rest, ":")
	if len(ms) != 2 || !digits(ms) {
		return 0, false
	}
	h, _ := strconv.Atoi(hs)
	m, _ := strconv.Atoi(ms)
	sec, frac := 0, 0.0
	if hasSec {
		ss, fs, hasFrac := strings.Cut(secs, ".")
		if len(ss) != 2 || !digits(ss) || hasFrac && !digits(fs) {
			return 0, false
		}
		sec, _ = strconv.Atoi(ss)
		if hasFrac {
			f, err := strconv.ParseFloat("."+fs, 64)
			if err != nil {
				return 0, false
			}
			frac = math.RoundToEven(f * 1e6)
		}
	}
	if h > maxHour || m > 59 || sec > 59 {
		return 0, false
	}
	return (int64(h)*3600+int64(m)*60+int64(sec))*1e6 + int64(frac), true
}

// zoneSeconds reads an offset east of UTC: "Z", "+hh", "+hh:mm", "+hhmm",
// "+hh:mm:ss" (or "-"), up to 15:59:59 as the server takes them.
func zoneSeconds(s string) (int, bool) {
	if s == "Z" || s == "z" {
		return 0, true
	}
	if len(s) < 3 || s[0] != '+' && s[0] != '-' {
		return 0, false
	}
	sign := 1
	if s[0] == '-' {
		sign = -1
	}
	f := strings.Split(s[1:], ":")
	if len(f) == 1 && len(f[0]) == 4 {
		f = []string{f[0][:2], f[0][2:]}
	}
	if len(f) > 3 {
		return 0, false
	}
	var v [3]int
	for i, p := range f {
		if len(p) != 2 || !digits(p) {
			return 0, false
		}
		v[i], _ = strconv.Atoi(p)
	}
	if v[0] > 15 || v[1] > 59 || v[2] > 59 {
		return 0, false
	}
	return sign * (v[0]*3600 + v[1]*60 + v[2]), true
}

// formatTime prints at (UTC) as the server's ISO output of kind with
// TimeZone UTC.
func formatTime(kind timeKind, at time.Time) string {
	y, mo, d := at.Date()
	bc := y <= 0
	if bc {
		y = 1 - y
	}
	b := make([]byte, 0, 40)
	b = appendPadded(b, y, 4)
	b = append(b, '-')
	b = appendPadded(b, int(mo), 2)
	b = append(b, '-')
	b = appendPadded(b, d, 2)
	if kind != kindDate {
		b = append(b, ' ')
		b = appendPadded(b, at.Hour(), 2)
		b = append(b, ':')
		b = appendPadded(b, at.Minute(), 2)
		b = append(b, ':')
		b = appendPadded(b, at.Second(), 2)
		if us := at.Nanosecond() / 1000; us != 0 {
			f := strconv.Itoa(us + 1e6) // "1" and six digits
			b = append(b, '.')
			b = append(b, strings.TrimRight(f[1:], "0")...)
		}
		if kind == kindTimestamptz {
			b = append(b, "+00"...)
		}
	}
	if bc {
		b = append(b, " BC"...)
	}
	return string(b)
}

func appendPadded(b []byte, v, width int) []byte {
	s := strconv.Itoa(v)
	for i := len(s); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, s...)
}

// --- interval -------------------------------------------------------------

// canonInterval returns the canonical form of an interval: interval
// compares spans, with a month of 30 days and a day of 24 hours ("1 mon"
// = "30 days" = "720:00:00"), so the form is the span in days and time,
// "-1 days -12:00:00", "30 days", "00:00:00". It reads the server's
// output in the postgres IntervalStyle, and integer amounts of
// microseconds to years ("90 minutes"); it refuses fractional amounts
// ("1.5 days"), which the server spreads over the smaller units, "ago",
// and the other IntervalStyles. It also refuses a text whose value
// depends on the reading session's IntervalStyle: a first field with a
// minus and a later one without a sign ("-1 days 02:00:00" is -22 hours
// to a session in the postgres style, -26 to one in sql_standard, which
// a role or database may set for the service's own queries); the
// server's output, and the form, sign every field after a negative one.
func canonInterval(s string) (string, error) {
	bad := func(why string) (string, error) { return "", formErr("interval", s, why) }
	f := strings.Fields(trimPGSpace(s))
	if len(f) == 0 || len(f) > 32 {
		return bad("want amounts and units")
	}
	if strings.HasPrefix(f[0], "-") {
		for i := 2; i < len(f); i++ {
			if (strings.Contains(f[i], ":") || i%2 == 0) && f[i][0] != '-' && f[i][0] != '+' {
				return bad("a field without a sign after a negative one: its sign depends on the session's IntervalStyle; sign every field")
			}
		}
	}
	const day = 86_400_000_000
	years, months, days, us := new(big.Int), new(big.Int), new(big.Int), new(big.Int)
	for i := 0; i < len(f); i++ {
		if strings.Contains(f[i], ":") {
			if i != len(f)-1 {
				return bad("the time must come last")
			}
			c := f[i]
			neg := false
			if c[0] == '+' || c[0] == '-' {
				neg, c = c[0] == '-', c[1:]
			}
			hs, rest, _ := strings.Cut(c, ":")
			if !digits(hs) || len(hs) > 12 {
				return bad("want [sign]h:mm[:ss[.fraction]]")
			}
			h, _ := strconv.ParseInt(hs, 10, 64)
			t, ok := clockMicros("00:"+rest, 0)
			if !ok {
				return bad("want [sign]h:mm[:ss[.fraction]]")
			}
			v := new(big.Int).Mul(big.NewInt(h), big.NewInt(3_600_000_000))
			v.Add(v, big.NewInt(t))
			if neg {
				v.Neg(v)
			}
			us.Add(us, v)
			if !us.IsInt64() {
				return bad("interval field value out of range")
			}
			continue
		}
		if i+1 >= len(f) {
			return bad("an amount without a unit")
		}
		n, ok := new(big.Int).SetString(strings.TrimPrefix(f[i], "+"), 10)
		if !ok || strings.HasPrefix(f[i], "+-") || len(f[i]) > 20 {
			return bad("want integer amounts")
		}
		i++
		switch strings.ToLower(f[i]) {
		case "year", "years":
			years.Add(years, n)
		case "mon", "mons", "month", "months":
			months.Add(months, n)
		case "week", "weeks":
			days.Add(days, n.Mul(n, big.NewInt(7)))
		case "day", "days":
			days.Add(days, n)
		case "hour", "hours":
			us.Add(us, n.Mul(n, big.NewInt(3_600_000_000)))
		case "minute", "minutes", "min", "mins":
			us.Add(us, n.Mul(n, big.NewInt(60_000_000)))
		case "second", "seconds", "sec", "secs":
			us.Add(us, n.Mul(n, big.NewInt(1_000_000)))
		case "millisecond", "milliseconds":
			us.Add(us, n.Mul(n, big.NewInt(1_000)))
		case "microsecond", "microseconds":
			us.Add(us, n)
		default:
			return bad("unknown unit " + f[i])
		}
		// The server adds each amount to its field with a check: years,
		// months and days are int32, the time int64 microseconds.
		if !fitsInt32(years) || !fitsInt32(months) || !fitsInt32(days) || !us.IsInt64() {
			return bad("interval field value out of range")
		}
	}
	if months.Add(months, years.Mul(years, big.NewInt(12))); !fitsInt32(months) {
		return bad("interval out of range")
	}
	// span = (months × 30 + days) days + us, as the server compares.
	span := new(big.Int).Mul(months, big.NewInt(30))
	span.Add(span, days)
	span.Mul(span, big.NewInt(day))
	span.Add(span, us)
	return formatSpan(span), nil
}

// formatSpan writes an interval of span microseconds in the one text
// the forms give it, which the server reads back as an equal interval:
// whole days and the time of day ("1 days 12:00:00", "-22:00:00"),
// with the days in the days field while they fit its int32. Past that the
// fewest months of 30 days that let the days fit go first, and past
// int32 months the days that still do not fit go into the time ("2147483647
// mons 2147483647 days 2562047788:00:54.775807"): the span of any interval
// the server holds fits.
func formatSpan(span *big.Int) string {
	const day = 86_400_000_000
	neg := span.Sign() < 0
	a := new(big.Int).Abs(span)
	dd, rem := new(big.Int).QuoRem(a, big.NewInt(day), new(big.Int))
	var months, days int64
	t := rem.Int64()
	if dd.IsInt64() && dd.Int64() <= math.MaxInt32 {
		days = dd.Int64()
	} else {
		// The fewest months: ceil((dd - MaxInt32) / 30), at most MaxInt32.
		m := new(big.Int).Sub(dd, big.NewInt(math.MaxInt32-29))
		m.Quo(m, big.NewInt(30))
		if !m.IsInt64() || m.Int64() > math.MaxInt32 {
			m.SetInt64(math.MaxInt32)
		}
		months = m.Int64()
		d := new(big.Int).Sub(dd, m.Mul(m, big.NewInt(30)))
		if d.Cmp(big.NewInt(math.MaxInt32)) > 0 {
			extra := new(big.Int).Sub(d, big.NewInt(math.MaxInt32))
			t += extra.Int64() * day // within int64: the rest came from the time field
			d.SetInt64(math.MaxInt32)
		}
		days = d.Int64()
	}
	var b strings.Builder
	field := func(v int64, unit string) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if neg {
			b.WriteByte('-')
		}
		b.WriteString(strconv.FormatInt(v, 10))
		b.WriteString(unit)
	}
	if months != 0 {
		field(months, " mons")
	}
	if days != 0 {
		field(days, " days")
	}
	if t != 0 || months == 0 && days == 0 {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if neg && t != 0 {
			b.WriteByte('-')
		}
		const hour = 3_600_000_000
		at := time.Unix(0, 0).UTC().Add(time.Duration(t%hour) * time.Microsecond)
		clock := formatTime(kindTimestamp, at) // "1970-01-01 00:mm:ss[.fraction]"
		b.WriteString(fmt.Sprintf("%02d", t/hour))
		b.WriteString(clock[len("1970-01-01 00"):])
	}
	return b.String()
}

// fitsInt32 reports whether v fits an int32.
func fitsInt32(v *big.Int) bool {
	return v.IsInt64() && v.Int64() >= math.MinInt32 && v.Int64() <= math.MaxInt32
}

// --- inet, cidr -------------------------------------------------------------

// canonInet returns the canonical form of an inet (cidr false) or cidr:
// the server's output ("10.0.0.1", "10.0.0.0/8", "::ffff:1.2.3.4"), which
// is one text per value. It reads addresses in full (IPv4 in four decimal
// parts without leading zeros) with an optional /bits (a full address
// without it is a host, /32 or /128, for a cidr as for an inet), and
// refuses the server's abbreviated forms ("10.1/16", "10/8"), whose
// width the server infers from the address's class.
func canonInet(cidr bool) func(string) (string, error) {
	name := "inet"
	if cidr {
		name = "cidr"
	}
	return func(s string) (string, error) {
		bad := func(why string) (string, error) { return "", formErr(name, s, why) }
		as, bs, slash := strings.Cut(s, "/")
		if strings.ContainsAny(as, "%") {
			return bad("a zone")
		}
		a, err := netip.ParseAddr(as)
		if err != nil {
			return bad("want a full address")
		}
		width := a.BitLen()
		bits := width
		if slash {
			v, err := strconv.Atoi(bs)
			if !digits(bs) || err != nil || len(bs) > 1 && bs[0] == '0' || v > width {
				return bad("want /bits")
			}
			bits = v
		}
		if cidr {
			if p, err := a.Prefix(bits); err != nil || p.Addr() != a {
				return bad("bits set right of the mask")
			}
		}
		var b strings.Builder
		if a.Is4() {
			b.WriteString(a.String())
		} else {
			b.WriteString(formatIPv6(a.As16()))
		}
		if cidr || bits != width {
			b.WriteByte('/')
			b.WriteString(strconv.Itoa(bits))
		}
		return b.String(), nil
	}
}

// inetFromServer is the canonical form of an inet the server printed,
// with its output function (already canonical) or with ::text (a host
// with /32 or /128, as the NOTIFY trigger sends it).
func inetFromServer(s string) (string, error) {
	if strings.HasSuffix(s, "/32") && !strings.Contains(s, ":") {
		return s[:len(s)-3], nil
	}
	if strings.HasSuffix(s, "/128") && strings.Contains(s, ":") {
		return s[:len(s)-4], nil
	}
	return s, nil
}

// formatIPv6 prints a as the server does (src/port/inet_net_ntop.c): the
// longest run of two or more zero words as "::" (the first of equal
// runs), words in lower-case hex without leading zeros, and the last 32
// bits in dotted decimal after six zero words, or five and ffff.
func formatIPv6(a [16]byte) string {
	var w [8]uint16
	for i := range w {
		w[i] = uint16(a[2*i])<<8 | uint16(a[2*i+1])
	}
	best, bestLen, cur, curLen := -1, 0, -1, 0
	for i := range w {
		if w[i] == 0 {
			if cur < 0 {
				cur, curLen = i, 1
			} else {
				curLen++
			}
			continue
		}
		if cur >= 0 && (best < 0 || curLen > bestLen) {
			best, bestLen = cur, curLen
		}
		cur = -1
	}
	if cur >= 0 && (best < 0 || curLen > bestLen) {
		best, bestLen = cur, curLen
	}
	if best >= 0 && bestLen < 2 {
		best = -1
	}
	b := make([]byte, 0, 46)
	for i := 0; i < len(w); i++ {
		if best >= 0 && i >= best && i < best+bestLen {
			if i == best {
				b = append(b, ':')
			}
			continue
		}
		if i != 0 {
			b = append(b, ':')
		}
		if i == 6 && best == 0 && (bestLen == 6 || bestLen == 5 && w[5] == 0xffff) {
			b = append(b, netip.AddrFrom4([4]byte(a[12:])).String()...)
			return string(b)
		}
		b = strconv.AppendUint(b, uint64(w[i]), 16)
	}
	if best >= 0 && best+bestLen == len(w) {
		b = append(b, ':')
	}
	return string(b)
}

// --- bytea ---------------------------------------------------------------

// canonBytea returns the canonical form of a bytea: "\x" and its bytes in
// lower-case hex, the server's output with bytea_output = 'hex'. It reads
// both input forms: hex (either case, spaces between bytes) and escape
// ("\\" for a backslash, "\ooo" in octal, any other byte as itself).
func canonBytea(s string) (string, error) {
	if len(s) >= 2 && s[0] == '\\' && s[1] == 'x' {
		h := s[2:]
		plain := len(h)%2 == 0
		for i := 0; plain && i < len(h); i++ {
			plain = h[i] >= '0' && h[i] <= '9' || h[i] >= 'a' && h[i] <= 'f'
		}
		if plain {
			return s, nil
		}
		b := make([]byte, 0, len(h)/2)
		for i := 0; i < len(h); {
			if c := h[i]; c == ' ' || c == '\n' || c == '\t' || c == '\r' {
				i++
				continue
			}
			if i+1 >= len(h) {
				return "", formErr("bytea", s, "an odd number of hex digits")
			}
			v, err := hex.DecodeString(h[i : i+2])
			if err != nil {
				return "", formErr("bytea", s, "not hex")
			}
			b = append(b, v[0])
			i += 2
		}
		return `\x` + hex.EncodeToString(b), nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			b = append(b, c)
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '\\':
			b = append(b, '\\')
			i++
		case i+3 < len(s) && s[i+1] >= '0' && s[i+1] <= '3' && octal(s[i+2]) && octal(s[i+3]):
			b = append(b, (s[i+1]-'0')<<6|(s[i+2]-'0')<<3|(s[i+3]-'0'))
			i += 3
		default:
			return "", formErr("bytea", s, `a backslash that is not \\ or \ooo`)
		}
	}
	return `\x` + hex.EncodeToString(b), nil
}

func octal(c byte) bool { return c >= '0' && c <= '7' }

// --- uuid ------------------------------------------------------------------

// canonUUID returns the canonical form of a uuid: lower-case hex in the
// groups 8-4-4-4-12, the server's output. It reads what uuid_in reads:
// either case, optional braces, a hyphen after any group of four digits.
func canonUUID(s string) (string, error) {
	if plainUUID(s) {
		return s, nil
	}
	t := s
	braces := strings.HasPrefix(t, "{")
	if braces {
		t = t[1:]
	}
	var u [16]byte
	for i := range u {
		if len(t) < 2 {
			return "", formErr("uuid", s, "too short")
		}
		v, err := hex.DecodeString(t[:2])
		if err != nil {
			return "", formErr("uuid", s, "not hex")
		}
		u[i] = v[0]
		t = t[2:]
		if len(t) > 0 && t[0] == '-' && i%2 == 1 && i < len(u)-1 {
			t = t[1:]
		}
	}
	if braces {
		if !strings.HasPrefix(t, "}") {
			return "", formErr("uuid", s, "no closing brace")
		}
		t = t[1:]
	}
	if t != "" {
		return "", formErr("uuid", s, "trailing text")
	}
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

// plainUUID reports whether s is a uuid in canonical form.
func plainUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return true
}
