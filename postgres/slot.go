package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// slotPrefix is how the names of the slots of the followers of table rel
// of schema begin: "cg_" and a hash of the table. Slots belong to a
// database, so the schema is part of it.
func slotPrefix(schema, rel string) string {
	return fmt.Sprintf("cg_%08x_", fnv32(schema+"."+rel))
}

// slotName returns the name of the permanent replication slot of the
// follower of table rel of schema with the given origin ([WithOrigin]):
// slotPrefix, and the origin in lower case with every other character than
// a letter, a digit or "_" made "_", shortened with a hash of the origin
// to PostgreSQL's 63 bytes.
func slotName(schema, rel, origin string) string {
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '_'
	}, origin)
	name := slotPrefix(schema, rel) + clean
	if len(name) > 63 {
		name = fmt.Sprintf("%s_%08x", name[:63-9], fnv32(origin))
	}
	return name
}

func fnv32(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

// SlotInfo describes a replication slot of a Follower, from [Slots].
type SlotInfo struct {
	Name          string
	Origin        string    // from cuckooguard_slots; "" if the slot is not recorded there
	Active        bool      // a follower streams from it now
	WALStatus     string    // pg_replication_slots.wal_status: reserved, extended, unreserved, or lost
	RetainedBytes int64     // WAL the server keeps for the slot: from its restart_lsn to the current position
	LastSeen      time.Time // when a follower last used it; zero if not recorded
	// Relay: the slot of a relay (a [Source], named by [SlotName]) that
	// streams this table and maybe others; Origin is the relay's name.
	Relay bool
}

// Slots lists the replication slots of the followers of table: each
// process with an origin has one, and a relay ([Source]) that streams the
// table has one for all its tables. A slot that is not active holds WAL on
// the server for a follower that may come back: see [DropStaleSlots].
func Slots(ctx context.Context, conn Conn, table string, opts ...Option) ([]SlotInfo, error) {
	if ctx == nil || noConn(conn) {
		return nil, errors.New("postgres: Slots needs a context and a connection")
	}
	c, err := adminConfig("Slots", opts)
	if err != nil {
		return nil, err
	}
	schema, rel, err := splitTable(ctx, conn, table)
	if err != nil {
		return nil, err
	}
	prefix := slotPrefix(schema, rel)
	// Without cuckooguard_slots (a follower that could not write it), no
	// slot has a record.
	reg := c.registryIn(schema)
	var noted bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, reg).Scan(&noted); err != nil {
		return nil, fmt.Errorf("postgres: list slots: %w", err)
	}
	if !noted {
		reg = `(SELECT NULL::text AS slot_name, NULL::text AS table_name, NULL::text AS origin, NULL::timestamptz AS last_seen)`
	}
	// The followers' slots by their names; a relay's (a Source's), which
	// streams several tables, by its row in cuckooguard_slots.
	q := fmt.Sprintf(`SELECT s.slot_name::text, coalesce(r.origin, ''), s.active, coalesce(s.wal_status, ''),
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint, r.last_seen,
		starts_with(s.slot_name::text, 'cg_relay_')
		FROM pg_replication_slots s LEFT JOIN %s r ON r.slot_name = s.slot_name
		WHERE s.database = current_database() AND (starts_with(s.slot_name::text, $1)
			OR starts_with(s.slot_name::text, 'cg_relay_') AND $2 = ANY (string_to_array(r.table_name, ',')))
		ORDER BY 1`, reg)
	rows, err := conn.Query(ctx, q, prefix, schema+"."+rel)
	if err != nil {
		return nil, fmt.Errorf("postgres: list slots: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (SlotInfo, error) {
		var s SlotInfo
		var seen *time.Time
		err := row.Scan(&s.Name, &s.Origin, &s.Active, &s.WALStatus, &s.RetainedBytes, &seen, &s.Relay)
		if seen != nil {
			s.LastSeen = *seen
		}
		return s, err
	})
}

// DropStaleSlots drops the replication slots of the followers of table
// that no follower streams from and that none has used for longer than
// olderThan (cuckooguard_slots.last_seen; a follower notes it when it
// connects and every 30 s while it streams), and returns their names. A
// permanent slot of a process that never comes back holds WAL on the
// server until it is dropped, or until max_slot_wal_keep_size makes the
// server give it up. A follower whose slot was dropped reads the whole
// table when it comes back.
func DropStaleSlots(ctx context.Context, conn Conn, table string, olderThan time.Duration, opts ...Option) ([]string, error) {
	if olderThan <= 0 {
		return nil, fmt.Errorf("postgres: DropStaleSlots: olderThan %v must be positive", olderThan)
	}
	c, err := adminConfig("DropStaleSlots", opts)
	if err != nil {
		return nil, err
	}
	slots, err := Slots(ctx, conn, table, opts...)
	if err != nil {
		return nil, err
	}
	schema, _, err := splitTable(ctx, conn, table)
	if err != nil {
		return nil, err
	}
	var dropped []string
	for _, s := range slots {
		if s.Active || s.LastSeen.IsZero() || time.Since(s.LastSeen) < olderThan {
			continue
		}
		// Not if it became active meanwhile: pg_drop_replication_slot
		// refuses an active slot.
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.Name); err != nil {
			return dropped, fmt.Errorf("postgres: drop slot %s: %w", s.Name, err)
		}
		dropped = append(dropped, s.Name)
		q := fmt.Sprintf(`DELETE FROM %s WHERE slot_name = $1`, c.registryIn(schema))
		if _, err := conn.Exec(ctx, q, s.Name); err != nil {
			return dropped, fmt.Errorf("postgres: forget slot %s: %w", s.Name, err)
		}
	}
	return dropped, nil
}

// slotState is what a follower needs to know of its slot.
type slotState struct {
	exists, active bool
	activePID      int64         // the walsender that holds it, if active
	confirmed      pglogrepl.LSN // confirmed_flush_lsn
	walStatus      string
	retained       int64
	walEnd         pglogrepl.LSN // the end of the server's flushed WAL, when a session read the slot (readWALEnd); 0 if not read
}

// readSlot returns the state of slot name.
func readSlot(ctx context.Context, conn Conn, name string) (slotState, error) {
	var st slotState
	var confirmed *string
	err := conn.QueryRow(ctx, `SELECT active, coalesce(active_pid, 0)::bigint, confirmed_flush_lsn::text, coalesce(wal_status, ''),
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, name).
		Scan(&st.active, &st.activePID, &confirmed, &st.walStatus, &st.retained)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("postgres: read slot %s: %w", name, err)
	}
	st.exists = true
	if confirmed != nil {
		if st.confirmed, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return st, fmt.Errorf("postgres: slot %s: %w", name, err)
		}
	}
	return st, nil
}

// dropSlot drops slot name if it exists and no one streams from it.
func dropSlot(ctx context.Context, conn Conn, name string) error {
	_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE slot_name = $1 AND database = current_database()`, name)
	if err != nil {
		return fmt.Errorf("postgres: drop slot %s: %w", name, err)
	}
	return nil
}

// noteSlot records in reg (cuckooguard_slots) that a follower (or a
// relay) uses slot name now, for table (a relay's: its tables of reg's
// schema, comma-separated, which change as they are published).
func noteSlot(ctx context.Context, conn Conn, reg, name, table, origin string) error {
	q := fmt.Sprintf(`INSERT INTO %s (slot_name, table_name, origin, last_seen) VALUES ($1, $2, $3, now())
		ON CONFLICT (slot_name) DO UPDATE SET table_name = EXCLUDED.table_name, last_seen = now()`, reg)
	if _, err := conn.Exec(ctx, q, name, table, origin); err != nil {
		return fmt.Errorf("postgres: note slot %s in %s: %w", name, reg, err)
	}
	return nil
}

// Unpublish undoes [Publish] for table: it drops the replication slots of
// the table's followers, ending the connections that still stream from
// them, the publication, and their rows in cuckooguard_slots, and that
// table too once no other table's followers have rows in it. A relay's
// slot ([Source]) that streamed the table and no other of the registry
// is dropped too (see also [DropRelaySlot]). Stop the
// followers first: one that runs on reads the table again and fails,
// since the publication is gone.
func Unpublish(ctx context.Context, conn Conn, table string, opts ...Option) error {
	if ctx == nil || noConn(conn) {
		return errors.New("postgres: Unpublish needs a context and a connection")
	}
	c, err := adminConfig("Unpublish", opts)
	if err != nil {
		return err
	}
	schema, rel, err := splitTable(ctx, conn, table)
	if err != nil {
		return err
	}
	prefix := slotPrefix(schema, rel)
	// A walsender may hold its slot for a moment after its follower went
	// away: end it, and wait until the slot is free.
	switch active, err := endWalsenders(ctx, conn, `starts_with(slot_name::text, $1)`, prefix); {
	case err != nil:
		return fmt.Errorf("postgres: unpublish: %w", err)
	case active > 0:
		return fmt.Errorf("postgres: unpublish: %d slots of %s.%s stay in use", active, schema, rel)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE starts_with(slot_name::text, $1)`, prefix); err != nil {
		return fmt.Errorf("postgres: unpublish: drop slots: %w", err)
	}
	if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{publicationName(schema, rel)}.Sanitize()); err != nil {
		return fmt.Errorf("postgres: unpublish: %w", err)
	}
	// The table's rows in cuckooguard_slots, and the table itself once no
	// other table's followers have rows in it.
	reg := c.registryIn(schema)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, reg).Scan(&exists); err != nil {
		return fmt.Errorf("postgres: unpublish: %w", err)
	}
	if !exists {
		return nil
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE starts_with(slot_name, $1)`, reg), prefix); err != nil {
		return fmt.Errorf("postgres: unpublish: %w", err)
	}
	// The relays that stream the table: it leaves their rows, and a relay
	// left with no table of this schema loses its row, and its slot if no
	// other schema's registry names it.
	if err := unpublishRelays(ctx, conn, reg, schema+"."+rel); err != nil {
		return err
	}
	var others bool
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT FROM %s)`, reg)).Scan(&others); err != nil {
		return fmt.Errorf("postgres: unpublish: %w", err)
	}
	if !others {
		if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS `+reg); err != nil {
			return fmt.Errorf("postgres: unpublish: %w", err)
		}
	}
	return nil
}

// noteSlot records in cuckooguard_slots that this follower uses slot
// name now, best effort: a follower whose role cannot write the table (or
// that finds none) follows all the same, and says so once.
func (f *Follower[K]) noteSlot(ctx context.Context, c *pgx.Conn, rel relation, name string) {
	err := noteSlot(ctx, c, f.registry.registryIn(rel.schema), name, f.table, f.origin)
	if err != nil && !f.noteSaid {
		f.noteSaid = true
		f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower cannot note its slot's use in cuckooguard_slots (run Publish, and grant its role SELECT, INSERT and UPDATE on the table); DropStaleSlots will not find the slot stale",
			slog.String("slot", name), slog.Any("error", err))
	}
}

// unpublishRelays takes table ("schema.table") out of the rows of relay
// slots in reg, and drops the slots left with no table.
func unpublishRelays(ctx context.Context, conn Conn, reg, table string) error {
	rows, err := conn.Query(ctx, fmt.Sprintf(`UPDATE %s SET table_name = array_to_string(array_remove(string_to_array(table_name, ','), $1), ',')
		WHERE starts_with(slot_name, 'cg_relay_') AND $1 = ANY (string_to_array(table_name, ',')) RETURNING slot_name, table_name`, reg), table)
	if err != nil {
		return fmt.Errorf("postgres: unpublish: %w", err)
	}
	type left struct{ slot, tables string }
	relays, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (left, error) {
		var l left
		return l, row.Scan(&l.slot, &l.tables)
	})
	if err != nil {
		return fmt.Errorf("postgres: unpublish: %w", err)
	}
	for _, l := range relays {
		if l.tables != "" {
			continue
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE slot_name = $1`, reg), l.slot); err != nil {
			return fmt.Errorf("postgres: unpublish: %w", err)
		}
		if err := dropSlotNow(ctx, conn, l.slot); err != nil {
			return err
		}
	}
	return nil
}

// DropRelaySlot drops the replication slot of the relay named name (a
// [Source]; see [SlotName]), ending the connection that streams from it
// if one does: for a service that no longer relays. Stop its relays
// first: one that runs on makes the slot again, and its followers read
// their tables again. A slot that does not exist is no error.
func DropRelaySlot(ctx context.Context, conn Conn, name string) error {
	if ctx == nil || noConn(conn) || name == "" {
		return errors.New("postgres: DropRelaySlot needs a context, a connection and the relay's name")
	}
	return dropSlotNow(ctx, conn, SlotName(name))
}

// dropSlotNow ends the walsender that holds slot, if any, waits for it to
// let go, and drops the slot.
func dropSlotNow(ctx context.Context, conn Conn, slot string) error {
	switch active, err := endWalsenders(ctx, conn, `slot_name = $1 AND database = current_database()`, slot); {
	case err != nil:
		return fmt.Errorf("postgres: drop slot %s: %w", slot, err)
	case active > 0:
		return fmt.Errorf("postgres: drop slot %s: it stays in use", slot)
	}
	return dropSlot(ctx, conn, slot)
}

// endWalsenders ends the walsenders that hold the slots where is true of
// (a condition on pg_replication_slots, with arg as $1), and waits for
// them to let go, for up to 10 s: a walsender may hold its slot for a
// moment after its client went away. It returns how many stay active.
func endWalsenders(ctx context.Context, conn Conn, where, arg string) (int, error) {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var active int
		if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots
			WHERE active AND `+where, arg).Scan(&active); err != nil {
			return 0, err
		}
		if active == 0 || time.Now().After(deadline) {
			return active, nil
		}
	}
}
