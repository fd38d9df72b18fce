package postgres

import (
	"context"
	"slices"
	"testing"
)

// TestNotifyWriterSettings is the NOTIFY writer of issue 49: a writer
// whose session prints values in other forms (extra_float_digits 0, which
// rounds floats; DateStyle SQL, DMY; IntervalStyle sql_standard; another
// TimeZone; bytea_output escape) inserts keys of each type whose printed
// form those settings shape. The trigger prints them in the follower's
// settings (its function's SET clauses), so every key the database finds
// reads present, and the follower never reads the table again.
func TestNotifyWriterSettings(t *testing.T) {
	const writerSettings = `SET extra_float_digits = 0; SET DateStyle = 'SQL, DMY'; SET IntervalStyle = sql_standard;
		SET TimeZone = 'America/New_York'; SET bytea_output = 'escape'`
	ctx := context.Background()
	names := []string{"double precision", "real", "timestamptz", "timestamp", "date", "interval", "bytea"}
	var checkedAll, wrongAll int
	for _, c := range keyTypeCases() {
		if !slices.Contains(names, c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			db, _ := pgConn(t)
			typ, dsn := keyTypeSchema(t, db, c, false)
			execAll(t, dsn, `CREATE TABLE keyed (k `+typ+` PRIMARY KEY, v text)`)
			if err := Install(ctx, db, "keyed", "k"); err != nil {
				t.Fatal(err)
			}
			n := startNode(t, dsn, "keyed", "k", "N", parseText, nodeConf{opts: []Option{WithNotify()}})
			w := connect(t, dsn)
			if _, err := w.Exec(ctx, writerSettings); err != nil {
				t.Fatal(err)
			}
			groups := append(append([][]string{}, c.seed...), c.later...)
			for _, g := range groups {
				if _, err := w.Exec(ctx, `INSERT INTO keyed VALUES (`+quoteLiteral(g[0])+`, 'writer')`); err != nil {
					t.Fatal(err)
				}
			}
			n.waitCurrent(t)
			checked, wrong, _ := lookups(t, dsn, "keyed", c.lookup, n.follower.Key, n.loader.MayContain, n.loader.Ready, groups)
			checkedAll, wrongAll = checkedAll+checked, wrongAll+wrong
			st := n.follower.Stats()
			var reads int64
			for _, v := range st.FullReads {
				reads += v
			}
			t.Logf("%s: %d lookups the database answers with a row, %d wrong 404s; full reads %v", c.name, checked, wrong, st.FullReads)
			if checked == 0 {
				t.Error("no lookup checked")
			}
			if reads != 1 {
				t.Errorf("the table was read %d times (%v), want once: the writer's rows made the follower read it again", reads, st.FullReads)
			}
		})
	}
	t.Logf("all: %d lookups checked, %d wrong 404s", checkedAll, wrongAll)
}
