package mysql

import (
	"fmt"
	"strings"
	"time"
)

// canonDatetime returns the text a DATETIME(prec) column prints for the
// value text spells: 'YYYY-MM-DD hh:mm:ss' and, when prec > 0, a point
// and exactly prec fraction digits. It takes the server's own print of
// any value as it is, and else these spellings of a valid date and time
// alone: 'Y-M-D', 'Y-M-D h:m', 'Y-M-D h:m:s[.f]' (a 'T' for the space
// too, fields of one or two digits, a year of four), 'YYYYMMDD' and
// 'YYYYMMDDhhmmss[.f]'. The server reads many more (other punctuation,
// two-digit years, spaces around), and reads dates with a zero month or
// day in some sql_modes and not in others: those return an error, and
// the lookup goes to the store.
//
// The server's = compares a text's every fraction digit, so a text with
// more digits than prec that are not zeros equals no value of the column
// (where a CAST or an INSERT would cut or round it, by sql_mode): an
// error too.
func canonDatetime(text string, prec int, col string) (string, error) {
	if printed(text, prec) {
		return text, nil
	}
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("mysql: key %q of %s is not a DATETIME(%d) text the guard can judge: %s", text, col, prec, why)
	}
	var f [6]int // year, month, day, hour, minute, second
	var frac string
	if !strings.Contains(text, "-") {
		num, fr, point := strings.Cut(text, ".")
		if !digits(num) || len(num) != 8 && len(num) != 14 || point && len(num) != 14 {
			return bad("not YYYYMMDD or YYYYMMDDhhmmss")
		}
		f[0], f[1], f[2] = atoi(num[:4]), atoi(num[4:6]), atoi(num[6:8])
		if len(num) == 14 {
			f[3], f[4], f[5] = atoi(num[8:10]), atoi(num[10:12]), atoi(num[12:14])
		}
		frac = fr
		if point && fr == "" {
			return bad("a point without digits")
		}
	} else {
		date, clock, hasClock := strings.Cut(text, " ")
		if !hasClock {
			date, clock, hasClock = strings.Cut(text, "T")
		}
		ymd := strings.Split(date, "-")
		if len(ymd) != 3 || len(ymd[0]) != 4 || !fields(ymd[1:]) || !digits(ymd[0]) {
			return bad("not Y-M-D")
		}
		f[0], f[1], f[2] = atoi(ymd[0]), atoi(ymd[1]), atoi(ymd[2])
		if hasClock {
			hms, fr, point := strings.Cut(clock, ".")
			parts := strings.Split(hms, ":")
			if len(parts) < 2 || len(parts) > 3 || !fields(parts) || point && (len(parts) != 3 || fr == "") {
				return bad("not h:m or h:m:s[.f]")
			}
			for i, p := range parts {
				f[3+i] = atoi(p)
			}
			frac = fr
		}
	}
	if !digits(frac) {
		return bad("the fraction is not digits")
	}
	if len(frac) > prec {
		if strings.Trim(frac[prec:], "0") != "" {
			return bad(fmt.Sprintf("more than %d fraction digits: the server's = compares them all, a CAST or an INSERT cuts or rounds them by sql_mode", prec))
		}
		frac = frac[:prec]
	}
	frac += strings.Repeat("0", prec-len(frac))
	y, mo, d := f[0], f[1], f[2]
	if y < 1 || mo < 1 || mo > 12 || d < 1 || d > time.Date(y, time.Month(mo)+1, 0, 0, 0, 0, 0, time.UTC).Day() ||
		f[3] > 23 || f[4] > 59 || f[5] > 59 {
		return bad("not a valid date and time with no zero part")
	}
	out := fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d", y, mo, d, f[3], f[4], f[5])
	if prec > 0 {
		out += "." + frac
	}
	return out, nil
}

// printed reports whether text is in the form a DATETIME(prec) column
// prints its values in, fields in range (a zero month or day included,
// which some sql_modes store).
func printed(text string, prec int) bool {
	n := len("2006-01-02 15:04:05")
	if prec > 0 {
		n += 1 + prec
	}
	if len(text) != n || text[4] != '-' || text[7] != '-' || text[10] != ' ' || text[13] != ':' || text[16] != ':' ||
		prec > 0 && text[19] != '.' {
		return false
	}
	for _, p := range [][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}, {20, n}} {
		if p[0] < n && !digits(text[p[0]:p[1]]) {
			return false
		}
	}
	return atoi(text[5:7]) <= 12 && atoi(text[8:10]) <= 31 && atoi(text[11:13]) <= 23 &&
		atoi(text[14:16]) <= 59 && atoi(text[17:19]) <= 59
}

// fields reports whether each of fs is one or two digits.
func fields(fs []string) bool {
	for _, s := range fs {
		if len(s) < 1 || len(s) > 2 || !digits(s) {
			return false
		}
	}
	return true
}

// atoi is the value of s, which is digits.
func atoi(s string) int {
	n := 0
	for i := range len(s) {
		n = n*10 + int(s[i]-'0')
	}
	return n
}

// datetimeText is the text of t, a DATETIME value a binlog parser that
// parses times gives (in UTC), at prec fraction digits.
func datetimeText(t time.Time, prec int) string {
	layout := "2006-01-02 15:04:05"
	if prec > 0 {
		layout += "." + strings.Repeat("0", prec)
	}
	return t.UTC().Format(layout)
}

// canonDate returns the text a DATE column prints for the value text
// spells: 'YYYY-MM-DD'. It reads what canonDatetime reads at midnight
// (the server compares a DATE with a text as a DATETIME: '2024-01-02
// 00:00:00' finds 2024-01-02, '2024-01-02 10:00:00' does not), and
// returns an error for a text of another time (which equals no DATE, but
// the guard leaves that to the store) and for one canonDatetime cannot
// judge.
func canonDate(text, col string) (string, error) {
	if len(text) == len("2006-01-02") && printed(text+" 00:00:00", 0) {
		return text, nil
	}
	dt, err := canonDatetime(text, 0, col)
	if err != nil {
		return "", fmt.Errorf("mysql: key %q of %s is not a DATE text the guard can judge: %w", text, col, err)
	}
	date, clock, _ := strings.Cut(dt, " ")
	if clock != "00:00:00" {
		return "", fmt.Errorf("mysql: key %q of %s is not a DATE text the guard can judge: a time of day other than midnight", text, col)
	}
	return date, nil
}

// maxTimeHours is the most hours a TIME holds: -838:59:59 to 838:59:59.
const maxTimeHours = 838

// canonTime returns the text a TIME(prec) column prints for the value
// text spells: '[-]hh:mm:ss', hours of two digits or three, and when
// prec > 0 a point and exactly prec fraction digits; no sign on zero. It
// reads '[-]h:m:s[.f]' and '[-]h:m' (minutes, not seconds: '11:12' is
// 11:12:00), hours of one to three digits, minutes and seconds of one or
// two, in range. The server reads many more ('D h:m:s', 'hhmmss', 'ss')
// and reads a text out of range ('00:60:00') as 00:00:00: those return an
// error, and the lookup goes to the store, as does a text with more than
// prec fraction digits that are not zeros.
func canonTime(text string, prec int, col string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("mysql: key %q of %s is not a TIME(%d) text the guard can judge: %s", text, col, prec, why)
	}
	s, neg := strings.CutPrefix(text, "-")
	hms, frac, point := strings.Cut(s, ".")
	parts := strings.Split(hms, ":")
	if len(parts) < 2 || len(parts) > 3 || point && (len(parts) != 3 || frac == "") || !digits(frac) {
		return bad("not [-]h:m:s[.f] or [-]h:m")
	}
	if len(parts[0]) < 1 || len(parts[0]) > 3 || !digits(parts[0]) || !fields(parts[1:]) {
		return bad("not [-]h:m:s[.f] or [-]h:m")
	}
	var f [3]int
	for i, p := range parts {
		f[i] = atoi(p)
	}
	if f[0] > maxTimeHours || f[1] > 59 || f[2] > 59 {
		return bad("out of range")
	}
	if len(frac) > prec {
		if strings.Trim(frac[prec:], "0") != "" {
			return bad(fmt.Sprintf("more than %d fraction digits: the server's = compares them", prec))
		}
		frac = frac[:prec]
	}
	frac += strings.Repeat("0", prec-len(frac))
	if f[0] == 0 && f[1] == 0 && f[2] == 0 && strings.Trim(frac, "0") == "" {
		neg = false // -00:00:00 is 00:00:00
	}
	out := fmt.Sprintf("%02d:%02d:%02d", f[0], f[1], f[2])
	if prec > 0 {
		out += "." + frac
	}
	if neg {
		out = "-" + out
	}
	return out, nil
}
