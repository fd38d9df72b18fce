package postgres

import (
	"context"
	"strings"
	"testing"
)

// TestKeyIntervalServiceStyle is the service's session of issue 49: the
// service's own queries run with IntervalStyle sql_standard (a role's or
// a database's default), where "-1 days 02:00:00" is -26 hours; the
// postgres style that the follower reads in makes it -22. Every spelling
// that the service's session finds a row for must read present, through
// Key and raw through the Loader: a text whose value depends on the
// style goes to the store.
func TestKeyIntervalServiceStyle(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn, `CREATE TABLE keyed (k interval PRIMARY KEY, v text)`,
		`INSERT INTO keyed VALUES ('-26:00:00', 'a'), ('26:00:00', 'c'), ('1 mon 2 days', 'd')`)
	if err := Publish(ctx, db, "keyed", "k"); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, dsn, "keyed", "k", "A", parseText, nodeConf{})
	n.waitCurrent(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	service := dsn + sep + "options=-c%20IntervalStyle%3Dsql_standard"
	spellings := [][]string{{"-1 days 02:00:00", "-1 days -02:00:00", "-1 -2:00:00", "-26:00:00", "-1 day -2 hours", "-1 days +02:00:00",
		"-22:00:00", "1 day 02:00:00", "+1 days +02:00:00", "26:00:00", "1 mon 2 days", "+1-0 +2", "32 days", "-1 days 2 hours"}}
	raw := func(s string) (string, error) { return s, nil }
	checked, wrong, undecided := lookups(t, service, "keyed", "", n.follower.Key, n.loader.MayContain, n.loader.Ready, spellings)
	rchecked, rwrong, _ := lookups(t, service, "keyed", "", raw, n.loader.MayContain, n.loader.Ready, spellings)
	t.Logf("a service in sql_standard: %d spellings found by its session, %d wrong 404s through Key (%d passed to the store), %d and %d raw through the Loader",
		checked, wrong, undecided, rchecked, rwrong)
	if checked == 0 || undecided == 0 {
		t.Errorf("checked %d, passed to the store %d: the test did not meet a style-dependent spelling", checked, undecided)
	}
}
