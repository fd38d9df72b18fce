package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// follow sets up how this replica keeps its guard in step with table:
// a postgres.Follower of its own (a slot and a walsender per replica), or
// with cfg.NATS a fanout.Relay and fanout.Follower (one slot for every
// replica: one of them relays the table's changes to JetStream, and all
// of them follow the stream).
func (a *app) follow(cfg config, table string) error {
	parse := func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
	if cfg.NATS == "" {
		fopts := []postgres.Option{postgres.WithLogger(a.log)}
		if cfg.Origin != "" {
			fopts = append(fopts, postgres.WithOrigin(cfg.Origin))
		}
		if cfg.Heartbeat > 0 {
			fopts = append(fopts, postgres.WithHeartbeat(cfg.Heartbeat))
		}
		if cfg.Notify {
			fopts = append(fopts, postgres.WithNotify())
		}
		if cfg.Snapshot != "" {
			fopts = append(fopts, postgres.WithSnapshotFile(cfg.Snapshot))
		}
		f, err := postgres.NewFollower(a.loader, cfg.DSN, table, "id", parse, fopts...)
		if err != nil {
			return err
		}
		a.follower = f
		// This replica's inserts are tagged so that its follower skips
		// them: its Loader adds their ids before writing.
		a.db.Tag = f.TagQuery
		return nil
	}
	if cfg.Notify || cfg.Snapshot != "" {
		return errors.New("-nats follows through the relay: -notify and -snapshot are for the direct follower (the relay's replica saves the guard to JetStream instead)")
	}
	if cfg.Origin == "" {
		return errors.New("-nats needs -origin: the relay's stream names the replica that tagged an insert")
	}
	nc, err := nats.Connect(cfg.NATS, nats.Name("cuckooguard httpapi "+cfg.Origin), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("-nats %s: %w", cfg.NATS, err)
	}
	a.nc = nc
	opts := []fanout.Option{fanout.WithLogger(a.log)}
	if cfg.Heartbeat > 0 {
		opts = append(opts, fanout.WithHeartbeat(cfg.Heartbeat))
	}
	// One relay per service, for all its tables (here one): the replicas
	// take turns, by the relay's lease, and share its one slot. A
	// service of more tables passes them all here (pgguard.Start does
	// all of this in one call).
	db, err := postgres.Relayed(cfg.DSN)
	if err != nil {
		return err
	}
	if a.relay, err = fanout.NewRelay(db, cfg.Service, nc, []follow.Table{{Table: table, Key: "id"}}, opts...); err != nil {
		return err
	}
	// The replica that relays saves its guard to JetStream's object store
	// every minute: a new replica starts from it and reads nothing from
	// the table.
	fopts := append(opts, fanout.WithRelay(cfg.Service), fanout.WithOrigin(cfg.Origin), fanout.WithSnapshots(fanout.DefaultBucket, time.Minute, a.relay.Leading))
	if a.relayed, err = fanout.NewFollower(a.loader, nc, db, table, "id", parse, fopts...); err != nil {
		return err
	}
	a.db.Tag = a.relayed.TagQuery
	return nil
}

// closeNATS closes the NATS connection, if any, once the relay and the
// follower have stopped.
func (a *app) closeNATS() {
	if a.nc != nil {
		a.nc.Close()
	}
}
