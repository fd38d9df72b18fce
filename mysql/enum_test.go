package mysql

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestEnumMembers(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string // nil for an error
	}{
		{"enum('a','B','c d')", []string{"a", "B", "c d"}},
		{"enum('it''s','''','')", []string{"it's", "'", ""}},
		{"enum('a,b','(x)')", []string{"a,b", "(x)"}},
		{`enum('x\\y')`, nil},
		{"enum('a',)", nil},
		{"enum('?')", nil},
		{"enum('a'", nil},
		{"enum()", nil},
		{"set('a')", nil},
	} {
		got, err := enumMembers(tc.in)
		if tc.want == nil && err == nil || tc.want != nil && (err != nil || !slices.Equal(got, tc.want)) {
			t.Errorf("enumMembers(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestEnumFromRow(t *testing.T) {
	k, err := formOf(column{name: "k", dataType: "enum", columnType: "enum('a','B')", charset: "utf8mb4", collation: "utf8mb4_bin"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"", "a", "B"} {
		got, ok, err := k.fromRow(int64(i))
		if err != nil || !ok || got != want {
			t.Errorf("fromRow(%d) = %q, %v, %v; want %q", i, got, ok, err, want)
		}
	}
	if got, _, err := k.fromRow(int64(3)); err == nil {
		t.Errorf("fromRow(3) = %q, want an error", got)
	}
	for in, want := range map[string]string{"a": "a", "a  ": "a", "b": "b", "B ": "B", "": "", "  ": "", "c": "c"} {
		if got, err := k.canon(in); err != nil || got != want {
			t.Errorf("canon(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestEnumKeys follows an ENUM key column under a few collations (of
// utf8mb4, and of utf8mb3, where the server refuses a text with a 4-byte
// character: the form must refuse it too), with rows another client
// writes before the read and in the stream (one of them the error value,
// index 0), and checks: every committed key reads present through the
// Loader, and the form agrees with the server's = on random spellings of
// members and of other texts, for each spelling the form does not refuse.
func TestEnumKeys(t *testing.T) {
	srv := testDSN(t)
	members := []string{"a", "B", "c d", "it's", "Zoë", "Straße", "Ω", "ÉTÉ", "x-y_z", "2", "tr "}
	quoted := make([]string, len(members))
	for i, m := range members {
		quoted[i] = "'" + strings.ReplaceAll(m, "'", "''") + "'"
	}
	alphabet := []string{"a", "A", "á", "b", "B", "c", "C", " ", "d", "z", "Z", "ë", "e", "É", "é", "s", "S", "ß", "t", "T", "r", "'", "😀", "ω", "Ω", "2", "-", "_", "x", "y"}
	for _, collation := range []string{"utf8mb4_general_ci", "utf8mb4_bin", "utf8mb4_general_nopad_ci", "utf8mb4_nopad_bin", "utf8mb3_general_ci"} {
		t.Run(collation, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(52, uint64(len(collation))))
			charset, _, _ := strings.Cut(collation, "_")
			table, c := newTable(t, srv, "k ENUM("+strings.Join(quoted, ",")+") CHARACTER SET "+charset+" COLLATE "+collation+" NOT NULL PRIMARY KEY, v INT", "")
			exec(t, c, "SET SESSION sql_mode = ''") // the error value, index 0
			insert := func(idx []int) {
				for _, i := range idx {
					exec(t, c, fmt.Sprintf("INSERT INTO `%s` (k) VALUES (%d)", table, i)) // a number is the index
				}
			}
			insert([]int{1, 2, 3, 4, 5})
			n := startNode(t, srv, table, "k", parseString)
			n.waitCurrent(t)
			insert([]int{6, 7, 8, 9, 10})
			exec(t, c, "INSERT INTO `"+table+"` (k) VALUES ('no such member')", // index 0
				"UPDATE `"+table+"` SET k = 11 WHERE k = 1")
			keys := n.keys(t)
			if !slices.Contains(keys, "") || !slices.Contains(keys, "tr") || len(keys) != 11 {
				t.Fatalf("keys %q, want 11 of them, '' and 'tr' among them", keys)
			}
			if checked, wrong := n.wrong404s(t, parseString); wrong != 0 || checked != len(keys) {
				t.Fatalf("%d wrong 404s of %d keys as the server gives them, want 0 of %d", wrong, checked, len(keys))
			}
			form := n.follower.keyFormNow()
			if !slices.Equal(form.members[1:], append(members[:len(members)-1:len(members)-1], "tr")) {
				t.Fatalf("members %q, want %q (the server drops a member's trailing spaces)", form.members[1:], members)
			}
			present := make(map[string]bool, len(keys))
			for _, k := range keys {
				present[k] = true
			}
			var checked, hits, agree, refused, disagree, wrong, serverErr int
			for range 1500 {
				var s string
				switch rnd.IntN(3) {
				case 0:
					s = variant(rnd, members[rnd.IntN(len(members))])
				case 1:
					s = members[rnd.IntN(len(members))]
				default:
					var b strings.Builder
					for range rnd.IntN(5) {
						b.WriteString(alphabet[rnd.IntN(len(alphabet))])
					}
					s = b.String()
				}
				r, err := c.Execute("SELECT CONCAT(k) FROM `"+table+"` WHERE k = ?", s)
				checked++
				if isServerErr(err) && charset == "utf8mb3" && hasSupplementary(s) {
					// Error 1267, an illegal mix of collations: the store
					// gets this text, which the form must not judge.
					serverErr++
					if got, err := form.canon(s); err == nil {
						disagree++
						t.Errorf("canon(%q) = %q; the server refuses the text", s, got)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				var found []string
				for i := range r.RowNumber() {
					f, _ := r.GetString(i, 0)
					found = append(found, f)
				}
				if len(found) > 0 {
					hits++
					if !n.loader.MayContain(s) {
						wrong++
						t.Errorf("lookup %q: the server finds %q, the guard says absent", s, found)
					}
				}
				got, err := form.canon(s)
				switch {
				case err != nil:
					refused++
				case len(found) == 1 && got == found[0], len(found) == 0 && !present[got]:
					agree++
				default:
					disagree++
					t.Errorf("canon(%q) = %q; the server's = finds %q", s, got, found)
				}
			}
			t.Logf("%d keys, 0 wrong 404s; %d spellings (the server finds %d, refuses %d): %d agree with the server's =, %d refused, %d disagree; %d wrong 404s",
				len(keys), checked, hits, serverErr, agree, refused, disagree, wrong)
			if disagree != 0 || wrong != 0 {
				t.Fatalf("%d disagreements, %d wrong 404s", disagree, wrong)
			}
		})
	}
}

func TestEnumRefusals(t *testing.T) {
	for _, c := range []column{
		{name: "k", dataType: "enum", columnType: "enum('','a')", charset: "utf8mb4", collation: "utf8mb4_bin"},
		{name: "k", dataType: "enum", columnType: `enum('a\\b')`, charset: "utf8mb4", collation: "utf8mb4_bin"},
		{name: "k", dataType: "enum", columnType: "enum('a')", charset: "latin1", collation: "latin1_swedish_ci"},
		{name: "k", dataType: "set", columnType: "set('a','b')", charset: "utf8mb4", collation: "utf8mb4_bin"},
	} {
		_, err := formOf(c, nil)
		if !errors.Is(err, ErrKeyType) || !strings.Contains(err.Error(), c.columnType) || !strings.Contains(err.Error(), "column k") {
			t.Errorf("%s: got %v, want ErrKeyType naming the column and the type", c.columnType, err)
		}
		t.Logf("%s: %v", c.columnType, err)
	}
}
