package mysql

import (
	"math/rand/v2"
	"testing"
)

// TestFollowerCollation follows a key column of the server's default
// collation, utf8mb4_general_ci (case- and accent-insensitive, PAD
// SPACE, every 4-byte character equal to every other), and looks keys up
// in other forms: each one the server finds must not read absent, on rows
// of the read and of the stream alike.
func TestFollowerCollation(t *testing.T) {
	srv := testDSN(t)
	table, c := newTable(t, srv, "k VARCHAR(64) NOT NULL PRIMARY KEY", "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci")
	rnd := rand.New(rand.NewPCG(11, 12))
	insert := func(words []string) {
		for _, w := range words {
			if _, err := c.Execute("INSERT IGNORE INTO `"+table+"` (k) VALUES (?)", w); err != nil {
				t.Fatal(err)
			}
		}
	}
	named := []string{"Alice@Example.com", "Straße", "😀x", "café", "trailing  "}
	insert(named[:3])
	var words []string
	for range 300 {
		words = append(words, randomText(rnd, false))
	}
	insert(words[:150])
	n := startNode(t, srv, table, "k", parseString)
	n.waitCurrent(t)
	insert(named[3:])
	insert(words[150:])
	if checked, wrong := n.wrong404s(t, parseString); wrong != 0 {
		t.Fatalf("%d wrong 404s of %d keys as stored", wrong, checked)
	}
	lookups := []string{"alice@example.com", "ALICE@EXAMPLE.COM   ", "STRASE", "strase", "🙂X", "𠀀x", "CAFE", "cafè ", "TRAILING"}
	for range 3000 {
		lookups = append(lookups, variant(rnd, words[rnd.IntN(len(words))]), randomText(rnd, false))
	}
	n.waitCurrent(t)
	var found, wrong, absent, rejected int
	for _, l := range lookups {
		may := n.loader.MayContain(l)
		if !n.exists(t, l) {
			absent++
			if !may {
				rejected++
			}
			continue
		}
		found++
		if !may && n.loader.Ready() {
			wrong++
			if wrong <= 5 {
				t.Logf("wrong 404 for %q, which the server finds", l)
			}
		}
	}
	t.Logf("%d lookups the server finds (%d wrong 404s); %d it does not, of which the guard rejected %d", found, wrong, absent, rejected)
	if wrong != 0 || found < len(lookups)/3 {
		t.Fatalf("%d wrong 404s of %d lookups the server finds", wrong, found)
	}
	if rejected < absent*9/10 {
		t.Fatalf("the guard rejected %d of %d absent lookups, want nearly all", rejected, absent)
	}
}
