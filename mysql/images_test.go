package mysql

import (
	"fmt"
	"testing"
)

// TestSessionImagesAndStatements: the direct Follower under two kinds of
// write the global settings do not show. A session's binlog_row_image =
// MINIMAL logs an UPDATE of another column with a before image of the
// primary key alone and an after image without it; a session's
// binlog_format = STATEMENT logs a write through a view or a trigger as
// text that does not name the table. Each makes the Follower read the
// table again; none deletes a key that is there or misses one that came.
func TestSessionImagesAndStatements(t *testing.T) {
	srv := testDSN(t)
	table, c := newTable(t, srv, "id VARCHAR(64) NOT NULL PRIMARY KEY, n INT", "")
	// Names that do not hold the table's: the statements name it nowhere.
	h := fnv64(table)
	view, src := fmt.Sprintf("view_%x", h), fmt.Sprintf("trig_%x", h)
	exec(t, c, "INSERT INTO `"+table+"` VALUES ('keep', 0)",
		"CREATE OR REPLACE VIEW `"+view+"` AS SELECT id, n FROM `"+table+"`",
		"CREATE TABLE IF NOT EXISTS `"+src+"` (id VARCHAR(64) NOT NULL PRIMARY KEY) ENGINE=InnoDB",
		"CREATE TRIGGER IF NOT EXISTS `"+src+"_t` AFTER INSERT ON `"+src+"` FOR EACH ROW INSERT INTO `"+table+"` VALUES (NEW.id, 0)")
	t.Cleanup(func() {
		exec(t, connect(t, srv), "DROP VIEW IF EXISTS `"+view+"`", "DROP TABLE IF EXISTS `"+src+"`")
	})
	n := startNode(t, srv, table, "id", parseString)
	n.waitCurrent(t)
	present := func(text string) {
		t.Helper()
		k, err := n.follower.Key(text)
		if err != nil {
			t.Fatal(err)
		}
		if !n.loader.MayContain(k) {
			t.Errorf("key %q reads absent: the row is there (a wrong 404); follower %+v", text, n.follower.Stats())
		}
	}
	w := connect(t, srv)
	exec(t, w, "SET SESSION binlog_row_image = 'MINIMAL'",
		"UPDATE `"+table+"` SET n = 1 WHERE id = 'keep'",
		"SET SESSION binlog_row_image = 'FULL'")
	n.waitApplied(t)
	present("keep")
	exec(t, w, "SET SESSION binlog_format = 'STATEMENT'",
		"INSERT INTO `"+view+"` VALUES ('through the view', 0)",
		"INSERT INTO `"+src+"` VALUES ('through the trigger')",
		"SET SESSION binlog_format = 'ROW'")
	n.waitApplied(t)
	present("through the view")
	present("through the trigger")
	present("keep")
	t.Logf("follower after the session writes: %+v", n.follower.Stats())
}
