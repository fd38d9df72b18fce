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
