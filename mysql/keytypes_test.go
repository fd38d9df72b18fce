package mysql

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestKeyTypes follows a key column of each type the guard holds, with
// values that reach it through the read and through the stream, and looks
// each key up in other texts the server reads as it: every lookup the
// server finds must read present, through both paths.
func TestKeyTypes(t *testing.T) {
	srv := testDSN(t)
	for _, tc := range []struct {
		name    string
		typ     string
		values  []string // SQL literals
		lookups []string // texts to look up (as a caller writes them)
	}{
		{"bigint", "BIGINT", []string{"-9223372036854775808", "0", "7", "9223372036854775807"},
			[]string{"-9223372036854775808", "07", "+7", "9223372036854775807", "8"}},
		{"int unsigned", "INT UNSIGNED", []string{"0", "2147483648", "4294967295"},
			[]string{"4294967295", "2147483648", "0", "-1"}},
		{"tinyint unsigned", "TINYINT UNSIGNED", []string{"200", "255"}, []string{"255", "200", "0200"}},
		{"decimal", "DECIMAL(10,2)", []string{"1.50", "-2.25", "0", "100"},
			[]string{"1.5", "1.50", "-2.250", "0.00", "100.0", "-0", "3"}},
		{"varbinary", "VARBINARY(16)", []string{"X'00FF10'", "X'616263'", "X'61626300'"},
			[]string{"\x00\xff\x10", "abc", "abc\x00", "ABC"}},
		{"utf8mb4_bin", "VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", []string{"'Alice'", "'b  '", "'😀'"},
			[]string{"Alice", "alice", "b", "b ", "😀", "🙂"}},
		{"utf8mb4_nopad_bin", "VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin", []string{"'x '", "'y'"},
			[]string{"x ", "x", "y", "y  "}},
		{"char general_ci", "CHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci", []string{"'Zoë'", "'  a'"},
			[]string{"ZOE", "zoë  ", "  A", "a"}},
		{"unicode_520_ci", "VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_520_ci",
			[]string{"'Straße'", "'ǅemal'", "'kg 😀'", "CONCAT('e', _utf8mb4 X'CC81')", "'一丁'", "'Æon'"},
			[]string{"STRASSE", "strasse  ", "STRAßE", "DŽEMAL", "dzemal", "㎏ 😀", "KG \U0001F600", "kg 🙂", "é", "E", "一丁 ", "丁一", "aeon", "AEON", "æon"}},
		{"enum unicode_ci", "ENUM('Straße','b','ǅ') CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci", []string{"'Straße'", "'b'", "'ǅ'"},
			[]string{"STRASSE", "strasse ", "B", "b  ", "dž", "DZ", "c"}},
		{"unicode_ci nopad", "VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_nopad_ci",
			[]string{"'Straße'", "'x '", "'😀'"},
			[]string{"STRASSE", "x ", "x", "X ", "🙂", "\U00020000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, c := newTable(t, srv, "k "+tc.typ+" NOT NULL PRIMARY KEY, v INT", "")
			half := len(tc.values) / 2
			for _, v := range tc.values[:half] {
				exec(t, c, fmt.Sprintf("INSERT INTO `%s` (k) VALUES (%s)", table, v))
			}
			n := startNode(t, srv, table, "k", parseString)
			n.waitCurrent(t)
			for _, v := range tc.values[half:] {
				exec(t, c, fmt.Sprintf("INSERT INTO `%s` (k) VALUES (%s)", table, v))
			}
			n.waitCurrent(t)
			if checked, wrong := n.wrong404s(t, parseString); wrong != 0 || checked != len(tc.values) {
				t.Fatalf("%d wrong 404s of %d keys as the server gives them, want 0 of %d", wrong, checked, len(tc.values))
			}
			for _, l := range tc.lookups {
				found, may := n.exists(t, l), n.loader.MayContain(l)
				if found && !may {
					t.Errorf("lookup %q: the server finds it, the guard says absent", l)
				}
				t.Logf("lookup %q: server %v, guard %v", l, found, may)
			}
		})
	}
}

// TestKeyTypesRefused checks that a key column of a type the guard cannot
// hold ends Run at its first session with ErrKeyType, naming the column,
// its type and what to use.
func TestKeyTypesRefused(t *testing.T) {
	srv := testDSN(t)
	for _, tc := range []struct {
		name string
		typ  string
		says []string
	}{
		{"timestamp", "TIMESTAMP(3)", []string{"column k", "timestamp(3)", "time_zone", "DATETIME"}},
		{"set", "SET('a','b')", []string{"column k", "set('a','b')", "ENUM"}},
		{"enum 4-byte", "ENUM('😀','a') CHARACTER SET utf8mb4", []string{"column k", "enum(", "4-byte", "VARCHAR"}},
		{"enum ''", "ENUM('','a')", []string{"column k", "error value", "rename"}},
		{"year", "YEAR", []string{"column k", "year", "DATE"}},
		{"uca1400", "VARCHAR(8) COLLATE utf8mb4_uca1400_ai_ci", []string{"column k", "utf8mb4_uca1400_ai_ci", "contractions", "utf8mb4_unicode_520_ci"}},
		{"czech", "VARCHAR(8) COLLATE utf8mb4_czech_ci", []string{"column k", "utf8mb4_czech_ci", "contractions", "utf8mb4_unicode_520_ci"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, _ := newTable(t, srv, "k "+tc.typ+" NOT NULL PRIMARY KEY", "")
			err := runOnce(t, srv, table, "k")
			if !errors.Is(err, ErrKeyType) {
				t.Fatalf("Run = %v, want ErrKeyType", err)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Run = %v, want it to say %q", err, s)
				}
			}
			t.Logf("%v", err)
		})
	}
}

// TestOldTemporalFormatRefused: a DATETIME or TIME key column made while
// mysql56_temporal_format was OFF (COLUMN_TYPE "time(3) /* mariadb-5.3 */")
// is refused with the reason and the fix: the binlog carries its values
// in a layout the follower cannot decode.
func TestOldTemporalFormatRefused(t *testing.T) {
	srv := testDSN(t)
	c := connect(t, srv)
	r, err := c.Execute("SELECT @@GLOBAL.mysql56_temporal_format")
	if err != nil {
		t.Fatal(err)
	}
	was, _ := r.GetInt(0, 0)
	t.Cleanup(func() { exec(t, connect(t, srv), fmt.Sprintf("SET GLOBAL mysql56_temporal_format = %d", was)) })
	for _, typ := range []string{"TIME(3)", "DATETIME", "DATETIME(3)"} {
		t.Run(typ, func(t *testing.T) {
			exec(t, c, "SET GLOBAL mysql56_temporal_format = OFF")
			table, _ := newTable(t, srv, "k "+typ+" NOT NULL PRIMARY KEY", "")
			exec(t, c, fmt.Sprintf("SET GLOBAL mysql56_temporal_format = %d", was))
			err := runOnce(t, srv, table, "k")
			if !errors.Is(err, ErrKeyType) {
				t.Fatalf("Run = %v, want ErrKeyType", err)
			}
			for _, s := range []string{"column k", "mariadb-5.3", "mysql56_temporal_format = ON", "FORCE"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Run = %v, want it to say %q", err, s)
				}
			}
		})
	}
}
