package pgguard

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// Teardown removes what the service named service made for tables, once
// every replica of it has stopped: the tables' publications, their rows in
// cuckooguard_slots and their followers' replication slots, and, with nc,
// the relay's slot, its messages and the consumers that read them, and the
// guards its replicas saved (the stream and the bucket themselves once
// nothing else is left in them; see fanout.Teardown). conn is a pool, a
// connection or a transaction of the database (postgres.Conn).
func Teardown(ctx context.Context, conn postgres.Conn, nc *nats.Conn, service string, tables ...string) error {
	if ctx == nil || conn == nil || service == "" {
		return errors.New("pgguard: Teardown needs a context, a connection and the service's name")
	}
	if nc != nil {
		origin, err := postgres.TeardownRelay(ctx, conn, service, tables)
		if err != nil {
			return err
		}
		return fanout.TeardownStream(ctx, origin, nc, service)
	}
	for _, t := range tables {
		if err := postgres.Unpublish(ctx, conn, t); err != nil {
			return err
		}
	}
	return nil
}
