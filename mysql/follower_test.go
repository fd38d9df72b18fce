package mysql

import (
	"testing"
)

// TestFollowerFollows reads a table, then follows inserts, deletes and key
// updates that another connection commits.
func TestFollowerFollows(t *testing.T) {
	srv := testDSN(t)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	insertRange(t, c, table, 0, 1000)
	n := startNode(t, srv, table, "id", parseInt64)
	took := n.waitCurrent(t)
	if checked, wrong := n.wrong404s(t, parseInt64); wrong != 0 || checked != 1000 {
		t.Fatalf("after the read: %d wrong 404s of %d keys, want 0 of 1000", wrong, checked)
	}
	t.Logf("following %v after the start; stats %+v", took, n.follower.Stats())
	insertRange(t, c, table, 1000, 2000)
	exec(t, c,
		"DELETE FROM `"+table+"` WHERE id < 500",
		"UPDATE `"+table+"` SET id = id + 100000 WHERE id BETWEEN 500 AND 599",
		"UPDATE `"+table+"` SET v = 1 WHERE id BETWEEN 600 AND 699", // the key stays
		"BEGIN", "INSERT INTO `"+table+"` (id) VALUES (-1)", "ROLLBACK",
	)
	checked, wrong := n.wrong404s(t, parseInt64)
	if wrong != 0 || checked != 1500 {
		t.Fatalf("%d wrong 404s of %d keys, want 0 of 1500", wrong, checked)
	}
	n.waitApplied(t)
	absent := 0
	for id := range int64(600) {
		if !n.loader.MayContain(id) {
			absent++
		}
	}
	if !n.loader.MayContain(int64(100550)) {
		t.Fatal("the updated key 100550 reads absent")
	}
	if n.loader.MayContain(int64(-1)) && absent < 590 {
		t.Fatalf("deleted keys: %d of 600 read absent, and the rolled-back -1 reads present: the follower applies what was not committed or not deleted", absent)
	}
	t.Logf("%d of 600 deleted or moved keys read absent; stats %+v", absent, n.follower.Stats())
	if absent < 590 {
		t.Fatalf("%d of 600 deleted or moved keys read absent, want nearly all", absent)
	}
}
