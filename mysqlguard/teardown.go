package mysqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/mysql"
)

// Execer is where [Teardown] runs its statements: a *sql.DB, a *sql.Conn
// or a *sql.Tx of any MySQL driver.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Teardown removes what the service cfg describes made for tables, once
// every replica of it has stopped: each table's heartbeat table
// ([HeartbeatTable]), with the heartbeat rows of every replica's direct
// follower, dropped through db (which needs the DROP privilege on them);
// and with cfg.NATS, the relay's place (its row of cuckooguard_relay and
// its Source's control row, removed through a connection of cfg.DSN's:
// mysql.Relayed's Teardown), its messages and the consumers that read
// them, and the guards its replicas saved (fanout.TeardownStream: the
// stream and the bucket themselves once nothing else is left in them).
// Of cfg it reads Service, NATS and, with NATS, DSN (the relay's place
// is removed through a connection of the relay's, which a *sql.DB cannot
// give).
//
// What stays: the tag table (mysql.DefaultTagTable) and, through NATS,
// cuckooguard_relay and cuckooguard_control, which every service of the
// database shares (the two hold no rows of the service's after it); the
// snapshot files in each replica's SnapshotDir, which are on the
// replicas' disks; and the binlog, which the server purges on its own
// schedule (neither a follower nor the relay holds a position on the
// server, as a PostgreSQL slot would). A table torn down while a replica
// still follows it gets its heartbeat table back at the follower's next
// session (it creates it if missing).
func Teardown(ctx context.Context, db Execer, cfg Config, tables ...string) error {
	if ctx == nil || db == nil || cfg.Service == "" {
		return errors.New("mysqlguard: Teardown needs a context, a connection and the service's name")
	}
	if cfg.NATS != nil {
		if cfg.DSN == "" {
			return errors.New("mysqlguard: Teardown through NATS needs the relay's DSN")
		}
		relayed, err := mysql.Relayed(cfg.DSN)
		if err != nil {
			return fmt.Errorf("mysqlguard: Teardown: %w", err)
		}
		origin, err := relayed.Teardown(ctx, cfg.Service, tables)
		if err != nil {
			return fmt.Errorf("mysqlguard: Teardown: %w", err)
		}
		if err := fanout.TeardownStream(ctx, origin, cfg.NATS, cfg.Service); err != nil {
			return fmt.Errorf("mysqlguard: Teardown: %w", err)
		}
	}
	for _, t := range tables {
		hb := HeartbeatTable(cfg.Service, t)
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+hb+"`"); err != nil {
			return fmt.Errorf("mysqlguard: Teardown: drop the heartbeat table %s of %s: %w", hb, t, err)
		}
	}
	return nil
}
