package mysql

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestCanonDatetime(t *testing.T) {
	for _, tc := range []struct {
		prec    int
		in      string
		want    string // "" for an error
		comment string
	}{
		{0, "2024-01-02 03:04:05", "2024-01-02 03:04:05", "as printed"},
		{0, "2024-1-2 3:4:5", "2024-01-02 03:04:05", ""},
		{0, "2024-01-02T03:04:05", "2024-01-02 03:04:05", ""},
		{0, "20240102030405", "2024-01-02 03:04:05", ""},
		{0, "20240102", "2024-01-02 00:00:00", ""},
		{0, "2024-01-02", "2024-01-02 00:00:00", ""},
		{0, "2024-01-02 3:4", "2024-01-02 03:04:00", ""},
		{0, "2024-01-02 03:04:05.000", "2024-01-02 03:04:05", "zeros beyond the precision"},
		{0, "2024-01-02 03:04:05.5", "", "the server's = compares every digit"},
		{3, "2024-01-02 03:04:05.1", "2024-01-02 03:04:05.100", ""},
		{3, "2024-01-02 03:04:05", "2024-01-02 03:04:05.000", ""},
		{3, "2024-01-02 03:04:05.123000", "2024-01-02 03:04:05.123", ""},
		{3, "2024-01-02 03:04:05.1234", "", ""},
		{6, "20240102030405.123456", "2024-01-02 03:04:05.123456", ""},
		{0, "0000-00-00 00:00:00", "0000-00-00 00:00:00", "a zero date as printed"},
		{2, "2024-01-00 00:00:00.00", "2024-01-00 00:00:00.00", "a zero day as printed"},
		{0, "2024-1-0 0:0:0", "", "a zero day in another spelling"},
		{0, "2024-02-30", "", "no such day"},
		{0, "2024-02-29", "2024-02-29 00:00:00", ""},
		{0, "2023-02-29", "", ""},
		{0, "2024-01-02 24:00:00", "", ""},
		{0, "2024-01-02 03:04:60", "", ""},
		{0, " 2024-01-02 03:04:05", "", "spaces around"},
		{0, "2024-01-02 03:04:05 ", "", ""},
		{0, "24-01-02 03:04:05", "", "a two-digit year"},
		{0, "2024/01/02 03:04:05", "", "other punctuation"},
		{0, "240102030405", "", "twelve digits: YYMMDDhhmmss"},
		{0, "2024-01-02 03:04:05.", "", ""},
		{0, "2024-01-02 03:04.5", "", ""},
		{0, "2024-01-02 03:04:05.1x", "", ""},
		{0, "", "", ""},
	} {
		t.Run(fmt.Sprintf("%d/%s", tc.prec, tc.in), func(t *testing.T) {
			got, err := canonDatetime(tc.in, tc.prec, "k")
			if tc.want == "" && err == nil || tc.want != "" && (err != nil || got != tc.want) {
				t.Errorf("canonDatetime(%q, %d) = %q, %v; want %q (%s)", tc.in, tc.prec, got, err, tc.want, tc.comment)
			}
		})
	}
}

func TestDatetimeFromRow(t *testing.T) {
	k, err := formOf(column{name: "k", dataType: "datetime", columnType: "datetime(3)"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{"2024-01-02 03:04:05.120", time.Date(2024, 1, 2, 3, 4, 5, 120_000_000, time.UTC)} {
		got, ok, err := k.fromRow(v)
		if err != nil || !ok || got != "2024-01-02 03:04:05.120" {
			t.Errorf("fromRow(%#v) = %q, %v, %v; want %q", v, got, ok, err, "2024-01-02 03:04:05.120")
		}
	}
}

// randomDatetime returns a random valid DATETIME's text at six digits.
func randomDatetime(rnd *rand.Rand) string {
	tm := time.Date(1000+rnd.IntN(9000), time.January, 1, 0, 0, 0, 0, time.UTC).
		Add(time.Duration(rnd.Int64N(int64(365 * 24 * time.Hour))))
	return tm.Format("2006-01-02 15:04:05") + fmt.Sprintf(".%06d", rnd.IntN(1_000_000))
}

// respell returns another spelling of s, a DATETIME(prec) value as the
// server prints it, at random: some the server reads as s, some it does
// not (a digit too many), some the form refuses.
func respell(rnd *rand.Rand, s string, prec int) string {
	date, clock, _ := strings.Cut(s, " ")
	hms, frac, _ := strings.Cut(clock, ".")
	ymd, hmsf := strings.Split(date, "-"), strings.Split(hms, ":")
	trim := func(f string) string {
		if rnd.IntN(2) == 0 && len(f) == 2 && f[0] == '0' {
			return f[1:]
		}
		return f
	}
	switch rnd.IntN(4) { // the fraction
	case 0:
		frac = strings.TrimRight(frac, "0")
	case 1:
		frac += strings.Repeat("0", rnd.IntN(4))
	case 2:
		frac += fmt.Sprint(rnd.IntN(10))
	}
	if frac != "" {
		frac = "." + frac
	}
	switch rnd.IntN(7) {
	case 0:
		return s
	case 1:
		return ymd[0] + ymd[1] + ymd[2] + hmsf[0] + hmsf[1] + hmsf[2] + frac
	case 2: // the server reads midnight
		if rnd.IntN(2) == 0 {
			return ymd[0] + ymd[1] + ymd[2]
		}
		return date
	case 3:
		return date + " " + trim(hmsf[0]) + ":" + trim(hmsf[1])
	case 4:
		return date + "T" + hms + frac
	case 5:
		return ymd[0] + "/" + ymd[1] + "/" + ymd[2] + " " + hms + frac
	}
	return ymd[0] + "-" + trim(ymd[1]) + "-" + trim(ymd[2]) + " " + trim(hmsf[0]) + ":" + trim(hmsf[1]) + ":" + trim(hmsf[2]) + frac
}

// TestDatetimeKeys follows a DATETIME(p) key column for each p, with rows
// another client writes before the read and in the stream, some of them
// updated, and checks: every committed key reads present through the
// Loader, and the form agrees with the server's = on random spellings of
// keys and of other times, for each spelling the form does not refuse.
func TestDatetimeKeys(t *testing.T) {
	srv := testDSN(t)
	for prec := range 7 {
		t.Run(fmt.Sprintf("p=%d", prec), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(52, uint64(prec)))
			t.Logf("seed 52, %d", prec)
			table, c := newTable(t, srv, fmt.Sprintf("k DATETIME(%d) NOT NULL PRIMARY KEY, v INT", prec), "")
			// A DATETIME is no instant: the writer's zone changes nothing.
			exec(t, c, "SET SESSION time_zone = '+05:30'")
			var values []string // as written: six digits, which the server cuts to prec
			for range 200 {
				values = append(values, randomDatetime(rnd))
			}
			values = append(values, "0000-00-00 00:00:00", "2024-01-00 12:00:00.5", "2024-02-29 23:59:59.999999", "9999-12-31 23:59:59")
			insert := func(vs []string) {
				for _, v := range vs {
					if _, err := c.Execute("INSERT IGNORE INTO `"+table+"` (k) VALUES (?)", v); err != nil {
						t.Fatal(err)
					}
				}
			}
			insert(values[:100])
			n := startNode(t, srv, table, "k", parseString)
			n.waitCurrent(t)
			insert(values[100:])
			for _, v := range values[:10] {
				if _, err := c.Execute(fmt.Sprintf("UPDATE IGNORE `%s` SET k = k + INTERVAL 1 SECOND WHERE k = CAST(? AS DATETIME(%d))", table, prec), v); err != nil {
					t.Fatal(err)
				}
			}
			keys := n.keys(t)
			if checked, wrong := n.wrong404s(t, parseString); wrong != 0 || checked != len(keys) {
				t.Fatalf("%d wrong 404s of %d keys as the server gives them, want 0 of %d", wrong, checked, len(keys))
			}
			present := make(map[string]bool, len(keys))
			for _, k := range keys {
				present[k] = true
			}
			var checked, hits, agree, refused, disagree, wrong int
			for range 2000 {
				base := keys[rnd.IntN(len(keys))]
				if rnd.IntN(3) == 0 {
					base = randomDatetime(rnd)[:len(base)]
				}
				s := respell(rnd, base, prec)
				r, err := c.Execute("SELECT CONCAT(k) FROM `"+table+"` WHERE k = ?", s)
				if err != nil {
					t.Fatal(err)
				}
				found := ""
				if r.RowNumber() > 0 {
					found, _ = r.GetString(0, 0)
				}
				checked++
				if found != "" {
					hits++
				}
				if found != "" && !n.loader.MayContain(s) {
					wrong++
					t.Errorf("lookup %q: the server finds %q, the guard says absent", s, found)
				}
				got, err := n.follower.keyFormNow().canon(s)
				switch {
				case err != nil:
					refused++
				case found != "" && got == found, found == "" && !present[got]:
					agree++
				default:
					disagree++
					t.Errorf("canon(%q) = %q; the server's = finds %q", s, got, found)
				}
			}
			t.Logf("%d keys, 0 wrong 404s; %d spellings (the server finds %d): %d agree with the server's =, %d refused, %d disagree; %d wrong 404s",
				len(keys), checked, hits, agree, refused, disagree, wrong)
			if agree < checked/2 {
				t.Errorf("the form judged %d of %d spellings, want most", agree, checked)
			}
		})
	}
}

func TestCanonDate(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"2024-01-02", "2024-01-02"},
		{"2024-1-2", "2024-01-02"},
		{"20240102", "2024-01-02"},
		{"2024-01-02 00:00:00", "2024-01-02"},
		{"2024-01-02 0:0", "2024-01-02"},
		{"20240102000000.000", "2024-01-02"},
		{"0000-00-00", "0000-00-00"},
		{"2024-01-00", "2024-01-00"},
		{"2024-02-29", "2024-02-29"},
		{"2024-01-02 10:00:00", ""},
		{"2024-01-02 00:00:00.5", ""},
		{"2023-02-29", "2023-02-29"}, // as printed: ALLOW_INVALID_DATES stores it, and = reads it so
		{"2023-2-29", ""},
		{"2024-1-0", ""},
		{"2024/01/02", ""},
		{"24-01-02", ""},
		{"", ""},
	} {
		got, err := canonDate(tc.in, "k")
		if tc.want == "" && err == nil || tc.want != "" && (err != nil || got != tc.want) {
			t.Errorf("canonDate(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestCanonTime(t *testing.T) {
	for _, tc := range []struct {
		prec     int
		in, want string
	}{
		{0, "01:02:03", "01:02:03"},
		{0, "1:2:3", "01:02:03"},
		{0, "11:12", "11:12:00"},
		{0, "838:59:59", "838:59:59"},
		{0, "-838:59:59", "-838:59:59"},
		{0, "-00:00:00", "00:00:00"},
		{0, "-0:0:0.000", "00:00:00"},
		{3, "-0:0:0.5", "-00:00:00.500"},
		{3, "01:02:03", "01:02:03.000"},
		{3, "01:02:03.12", "01:02:03.120"},
		{3, "01:02:03.120000", "01:02:03.120"},
		{6, "100:00:00.000001", "100:00:00.000001"},
		{3, "01:02:03.1204", ""},
		{0, "01:02:03.5", ""},
		{0, "839:00:00", ""},
		{0, "00:60:00", ""},
		{0, "00:00:60", ""},
		{0, "1000:00:00", ""},
		{0, "0 01:02:03", ""},
		{0, "010203", ""},
		{0, "12", ""},
		{0, "01:02:03.", ""},
		{0, "01:02.5", ""},
		{0, "--01:02:03", ""},
		{0, "+01:02:03", ""},
		{0, "", ""},
	} {
		got, err := canonTime(tc.in, tc.prec, "k")
		if tc.want == "" && err == nil || tc.want != "" && (err != nil || got != tc.want) {
			t.Errorf("canonTime(%q, %d) = %q, %v; want %q", tc.in, tc.prec, got, err, tc.want)
		}
	}
}

// randomDate returns a random DATE's text.
func randomDate(rnd *rand.Rand) string {
	return time.Date(1000+rnd.IntN(9000), time.January, 1+rnd.IntN(366), 0, 0, 0, 0, time.UTC).Format("2006-01-02")
}

// respellDate returns another spelling of s, a DATE as the server prints
// it, at random: some the server reads as s, some as another value, some
// the form refuses.
func respellDate(rnd *rand.Rand, s string) string {
	ymd := strings.Split(s, "-")
	trim := func(f string) string {
		if rnd.IntN(2) == 0 && len(f) == 2 && f[0] == '0' {
			return f[1:]
		}
		return f
	}
	switch rnd.IntN(9) {
	case 0:
		return s
	case 1:
		return ymd[0] + ymd[1] + ymd[2]
	case 2:
		return s + " 00:00:00"
	case 3:
		return s + fmt.Sprintf(" %02d:00:00", rnd.IntN(24))
	case 4:
		return s + " 0:0:0.000"
	case 5:
		return ymd[0] + "/" + ymd[1] + "/" + ymd[2]
	case 6:
		return ymd[0][2:] + "-" + ymd[1] + "-" + ymd[2]
	case 7:
		return s + "T00:00"
	}
	return ymd[0] + "-" + trim(ymd[1]) + "-" + trim(ymd[2])
}

// randomTime returns a random TIME's text at six digits.
func randomTime(rnd *rand.Rand) string {
	h := rnd.IntN(24)
	if rnd.IntN(4) == 0 {
		h = rnd.IntN(maxTimeHours + 1)
	}
	sign := ""
	if rnd.IntN(3) == 0 {
		sign = "-"
	}
	return fmt.Sprintf("%s%02d:%02d:%02d.%06d", sign, h, rnd.IntN(60), rnd.IntN(60), rnd.IntN(1_000_000))
}

// respellTime returns another spelling of s, a TIME(prec) as the server
// prints it, at random: some the server reads as s, some as another
// value, some the form refuses.
func respellTime(rnd *rand.Rand, s string) string {
	sign, rest := "", s
	if r, ok := strings.CutPrefix(s, "-"); ok {
		sign, rest = "-", r
	}
	hms, frac, _ := strings.Cut(rest, ".")
	p := strings.Split(hms, ":")
	trim := func(f string) string {
		if rnd.IntN(2) == 0 && len(f) >= 2 && f[0] == '0' {
			return f[1:]
		}
		return f
	}
	switch rnd.IntN(4) {
	case 0:
		frac = strings.TrimRight(frac, "0")
	case 1:
		frac += strings.Repeat("0", rnd.IntN(4))
	case 2:
		frac += fmt.Sprint(rnd.IntN(10))
	}
	if frac != "" {
		frac = "." + frac
	}
	switch rnd.IntN(8) {
	case 0:
		return s
	case 1:
		return sign + p[0] + ":" + p[1] // minutes, not seconds
	case 2:
		return sign + p[0] + p[1] + p[2] + frac // hhmmss: refused
	case 3:
		return sign + "0 " + hms + frac // D h:m:s: refused
	case 4:
		return sign + p[0] + ":" + p[1] + ":" + fmt.Sprint(60+rnd.IntN(40)) // out of range: refused
	case 5:
		return "-" + rest
	}
	return sign + trim(p[0]) + ":" + trim(p[1]) + ":" + trim(p[2]) + frac
}

// TestDateKeys follows a DATE key column, and a TIME(p) one for some p,
// with rows another client writes before the read and in the stream, and
// checks: every committed key reads present through the Loader, and the
// form agrees with the server's = on random spellings of keys and of
// other values, for each spelling the form does not refuse.
func TestDateKeys(t *testing.T) {
	srv := testDSN(t)
	type kind struct {
		name, typ string
		value     func(*rand.Rand) string
		respell   func(*rand.Rand, string) string
		special   []string
	}
	// The writer's session stores zero parts and invalid days
	// (ALLOW_INVALID_DATES), and looks up in that mode too.
	kinds := []kind{{"date", "DATE", randomDate, respellDate,
		[]string{"0000-00-00", "2024-01-00", "2024-00-00", "2024-02-29", "2023-02-29", "2023-04-31", "9999-12-31", "1000-01-01"}}}
	for prec := range 7 {
		kinds = append(kinds, kind{fmt.Sprintf("time(%d)", prec), fmt.Sprintf("TIME(%d)", prec), randomTime, respellTime,
			[]string{"00:00:00", "-00:00:00.5", "838:59:59", "-838:59:59", "00:00:01", "-00:00:01", "100:00:00.000001"}})
	}
	var total int
	for i, kd := range kinds {
		t.Run(kd.name, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(53, uint64(i)))
			t.Logf("seed 53, %d", i)
			table, c := newTable(t, srv, "k "+kd.typ+" NOT NULL PRIMARY KEY, v INT", "")
			exec(t, c, "SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")
			var values []string
			for range 200 {
				values = append(values, kd.value(rnd))
			}
			values = append(values, kd.special...)
			insert := func(vs []string) {
				for _, v := range vs {
					if _, err := c.Execute("INSERT IGNORE INTO `"+table+"` (k) VALUES (?)", v); err != nil {
						t.Fatal(err)
					}
				}
			}
			insert(values[:100])
			n := startNode(t, srv, table, "k", parseString)
			n.waitCurrent(t)
			insert(values[100:])
			keys := n.keys(t)
			if checked, wrong := n.wrong404s(t, parseString); wrong != 0 || checked != len(keys) {
				t.Fatalf("%d wrong 404s of %d keys as the server gives them, want 0 of %d", wrong, checked, len(keys))
			}
			present := make(map[string]bool, len(keys))
			for _, k := range keys {
				present[k] = true
			}
			var checked, hits, agree, refused, disagree, wrong int
			for range 2000 {
				base := keys[rnd.IntN(len(keys))]
				if rnd.IntN(3) == 0 {
					if b, err := n.follower.keyFormNow().canon(kd.value(rnd)); err == nil {
						base = b
					}
				}
				s := kd.respell(rnd, base)
				r, err := c.Execute("SELECT CONCAT(k) FROM `"+table+"` WHERE k = ?", s)
				if err != nil {
					t.Fatal(err)
				}
				found := ""
				if r.RowNumber() > 0 {
					found, _ = r.GetString(0, 0)
				}
				checked++
				if found != "" {
					hits++
				}
				if found != "" && !n.loader.MayContain(s) {
					wrong++
					t.Errorf("lookup %q: the server finds %q, the guard says absent", s, found)
				}
				got, err := n.follower.keyFormNow().canon(s)
				switch {
				case err != nil:
					refused++
				case found != "" && got == found, found == "" && !present[got]:
					agree++
				default:
					disagree++
					t.Errorf("canon(%q) = %q; the server's = finds %q", s, got, found)
				}
			}
			total += checked
			t.Logf("%d keys, 0 wrong 404s; %d spellings (the server finds %d): %d agree with the server's =, %d refused, %d disagree; %d wrong 404s",
				len(keys), checked, hits, agree, refused, disagree, wrong)
			if agree < checked/2 {
				t.Errorf("the form judged %d of %d spellings, want most", agree, checked)
			}
		})
	}
	t.Logf("%d spellings in all", total)
}
