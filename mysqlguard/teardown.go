package mysqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Execer is where [Teardown] runs its statements: a *sql.DB, a *sql.Conn
// or a *sql.Tx of any MySQL driver.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Teardown removes what the service named service made in the database
// for tables, once every replica of it has stopped: each table's
// heartbeat table ([HeartbeatTable]), with the heartbeat rows of every
// replica's follower. db needs the DROP privilege on them.
//
// What stays: the tag table (mysql.DefaultTagTable), which every service
// of the database shares and which holds no rows once a write has
// committed or rolled back; the snapshot files in each replica's
// SnapshotDir, which are on the replicas' disks; and the binlog, which
// the server purges on its own schedule (a follower holds no position on
// the server, as a PostgreSQL slot would). A table torn down while a
// replica still follows it gets its heartbeat table back at the
// follower's next session (it creates it if missing).
func Teardown(ctx context.Context, db Execer, service string, tables ...string) error {
	if ctx == nil || db == nil || service == "" {
		return errors.New("mysqlguard: Teardown needs a context, a connection and the service's name")
	}
	for _, t := range tables {
		hb := HeartbeatTable(service, t)
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+hb+"`"); err != nil {
			return fmt.Errorf("mysqlguard: Teardown: drop the heartbeat table %s of %s: %w", hb, t, err)
		}
	}
	return nil
}
