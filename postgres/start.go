package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cuckooguard/cuckooguard/guard"
)

// A start is where a session's stream begins, decided before the session
// makes it so: resume from the position the guard reflects, restore the
// guard saved in the snapshot file and stream from its position, or read
// the table under the snapshot of a new slot and stream from the slot's
// consistent point.
type start struct {
	how    startHow
	reason ReadReason // for a read: why the table must be read
}

type startHow int

const (
	resume startHow = iota
	restore
	read
)

// decide returns where the next session starts, from what the Follower
// knows at the session's beginning:
//   - pending: why the table must be read ("" if nothing says so; ReadStart
//     until a session has started)
//   - temporary: without an origin, no slot outlives a session
//   - file: the Follower keeps a snapshot file
//   - pos: the position the guard reflects
//   - st: the state of the Follower's slot, and the end of the server's
//     WAL when it was read (0 if unknown)
//   - pub: the publication's version now (publicationVersion)
//
// A position beyond the end of the server's WAL is one the database no
// longer has: it was restored to an earlier point (from a storage
// snapshot or a copy of its data directory, which keep the slot), and
// resuming would skip, as if streamed already, the transactions it
// commits up to the old position. The server's WAL never ends before
// what it sent (a walsender sends only flushed WAL, and the server's
// crash keeps that), so this says nothing false of a database that did
// not go back. It misses a restored database that has written more WAL
// since the restore than the follower had applied beyond the restored
// end.
//
// The Follower clears pending in one place, once a stream has started
// where it was asked to (Follower.streamStarted).
func decide(pending ReadReason, temporary, file bool, pos *position, st slotState, pub string) start {
	switch {
	case temporary:
		return start{read, cmpOr(pending, ReadNoResume)}
	case pending == ReadStart && file:
		return start{how: restore} // which falls back to a read (Follower.restore)
	case pending != "":
		return start{read, pending}
	case !pos.valid:
		return start{read, ReadResumeFailed}
	case !st.exists:
		return start{read, ReadSlotMissing}
	case st.walStatus == "lost":
		return start{read, ReadSlotLost}
	case st.walEnd != 0 && pos.applied > st.walEnd:
		return start{read, ReadRewound}
	case st.confirmed > pos.applied:
		return start{read, ReadSlotMoved}
	case pub != pos.pubVersion:
		return start{read, ReadPublication}
	}
	return start{how: resume}
}

func cmpOr(r, def ReadReason) ReadReason {
	if r == "" {
		return def
	}
	return r
}

// require records that the next session must read the table, for
// reason, unless an earlier reason is pending: the first cause is the one
// counted.
func (f *Follower[K]) require(reason ReadReason) {
	f.pos.valid = false
	if f.pending == "" {
		f.pending = reason
	}
}

// streamStarted records that the session's stream started where the
// Follower asked, from slot at lsn: nothing is pending any more. It is
// the one place that clears pending.
func (f *Follower[K]) streamStarted() {
	f.pending = ""
}

// restore installs the guard of the snapshot file if the file is of this
// cluster, database, slot, table and key column and publication version,
// and the slot still has the changes since its position; it returns that
// position. Otherwise it returns why a full read is needed, and logs it.
func (f *Follower[K]) restore(ctx context.Context, id slotID, st slotState, pub string) (pglogrepl.LSN, ReadReason) {
	h, g, err := readSnapshotFile(f.snapPath, guard.Like(f.feed.Guard()))
	fallback := func(why ReadReason, detail string) (pglogrepl.LSN, ReadReason) {
		if g != nil {
			g.Close()
		}
		level := slog.LevelWarn
		if why == ReadNoSnapshot {
			level = slog.LevelInfo // the first start of a process
		}
		f.log.LogAttrs(ctx, level, "cuckooguard: follower cannot start from its snapshot file; it reads the table",
			slog.String("file", f.snapPath), slog.String("reason", string(why)), slog.String("detail", detail))
		return 0, why
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fallback(ReadNoSnapshot, err.Error())
	case err != nil:
		return fallback(ReadBadSnapshot, err.Error())
	case h.slot.system != id.system || h.slot.database != id.database:
		return fallback(ReadBadSnapshot, fmt.Sprintf("the file is of database %s of cluster %s, this is database %s of cluster %s",
			h.slot.database, h.slot.system, id.database, id.system))
	case h.slot.name != id.name || h.table != f.table || h.key != f.key:
		return fallback(ReadBadSnapshot, fmt.Sprintf("the file is of slot %s, table %s, key %s", h.slot.name, h.table, h.key))
	case !st.exists:
		return fallback(ReadSlotMissing, "slot "+id.name+" does not exist")
	case st.walStatus == "lost":
		return fallback(ReadSlotLost, "the server removed WAL that slot "+id.name+" needed")
	case st.walEnd != 0 && h.lsn > st.walEnd:
		return fallback(ReadRewound, fmt.Sprintf("the server's WAL ends at %s, the file is at %s: the database was restored to an earlier point", st.walEnd, h.lsn))
	case st.confirmed > h.lsn:
		return fallback(ReadStaleSnapshot, fmt.Sprintf("the slot is at %s, the file at %s", st.confirmed, h.lsn))
	case h.pubVersion != pub:
		return fallback(ReadPublication, fmt.Sprintf("the publication is at version %s, the file's changes were decoded under %s", pub, h.pubVersion))
	}
	if err := f.feed.Replace(g); err != nil {
		return fallback(ReadBadSnapshot, err.Error())
	}
	f.dropHeld()
	// The Inserts that ran before Replace added their keys to the guard
	// it closed, and tagged their writes with the run's tag until now:
	// those must be applied from the stream, not skipped. Replace waited
	// for them (and held the later ones back), so a new tag tells them
	// apart; an Insert that starts between Replace and here gets one
	// extra copy (applied, and added), never none.
	f.tags.NewRun()
	f.pos.started(h.slot, h.lsn, h.lsn, h.pubVersion, time.Now())
	f.restores.Add(1)
	f.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: follower starts from its snapshot file",
		slog.String("file", f.snapPath), slog.String("lsn", h.lsn.String()), slog.Int("keys", g.Len()))
	return h.lsn, ""
}

// readAll reads the whole table into a fresh guard, under the snapshot
// that a new slot exports as it is made, and returns the slot and its
// consistent point, where the read and the stream meet: the read sees
// exactly the transactions that committed before it, and the stream
// carries exactly the others. A permanent slot is dropped and made again,
// after the snapshot file of the old one is removed (a file always belongs
// to the slot instance that exists); without an origin the slot is
// temporary and dies with the session.
//
// The slot is made inside the Loader's Resync, after the fresh guard is
// installed for inserts: Resync waits for this process's inserts in
// flight, whose changes the stream skips as its own, so each of them has
// committed before the slot's snapshot (and the read sees it) or reaches
// the fresh guard directly.
func (f *Follower[K]) readAll(ctx context.Context, sender *pgx.Conn, rc *pgconn.PgConn, id slotID, rel relation, pub string, reason ReadReason) (string, pglogrepl.LSN, error) {
	f.pos.valid = false
	f.dropHeld() // the read sees every deletion that is visible, and the stream brings the others
	slot, temporary := id.name, id.name == ""
	if temporary {
		slot = fmt.Sprintf("cg_tmp_%016x", rand.Uint64())
	} else {
		if f.snapPath != "" {
			if err := removeSnapshotFile(f.snapPath); err != nil {
				// Harmless: the slot made next confirms past the file's
				// position at once, and a restart finds the file stale.
				f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower could not remove its old snapshot file", slog.Any("error", err))
			}
			f.pos.durable = 0
		}
		if err := dropSlot(ctx, sender, slot); err != nil {
			return "", 0, failed(ReasonSlot, err)
		}
	}
	begin := time.Now()
	var point pglogrepl.LSN
	var n int64
	err := f.feed.Resync(ctx, func(ctx context.Context, add func(K) error) error {
		res, err := pglogrepl.CreateReplicationSlot(ctx, rc, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
			Temporary: temporary, SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication})
		if err != nil {
			return failed(ReasonSlot, fmt.Errorf("create slot %s: %w", slot, err))
		}
		if point, err = pglogrepl.ParseLSN(res.ConsistentPoint); err != nil {
			return failed(ReasonSlot, fmt.Errorf("slot %s: %w", slot, err))
		}
		tx, err := sender.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		// The exported snapshot lives until the slot's connection runs its
		// next command, START_REPLICATION: import it first.
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(res.SnapshotName)); err != nil {
			return err
		}
		n, err = f.scan(ctx, tx, rel, add)
		return err
	})
	if err != nil {
		var se *sessionError
		if errors.As(err, &se) {
			return "", 0, err
		}
		return "", 0, failed(ReasonResync, fmt.Errorf("postgres: follower read: %w", err))
	}
	id.name, id.created = slot, point
	f.pos.started(id, point, 0, pub, time.Time{}) // saved zero: the file is written at once
	f.read(ctx, reason, n, time.Since(begin))
	return slot, point, nil
}

// verifyStart checks, once the stream of slot has started from at and
// the slot is held by the stream's connection (pid), that the server
// started where it was asked. A slot that had moved past at, or was made
// again since the session read it, makes the server forward the start
// silently (its log says "has been already streamed, forwarding to"),
// past changes the guard lacks: errSlotMoved, and the next session reads
// the table. Held by this session, the slot cannot move any more.
func verifyStart(ctx context.Context, c *pgx.Conn, slot string, pid uint32, at pglogrepl.LSN) error {
	var holder *int64
	var confirmed *string
	err := c.QueryRow(ctx, `SELECT active_pid::bigint, confirmed_flush_lsn::text FROM pg_replication_slots
		WHERE slot_name = $1 AND database = current_database()`, slot).Scan(&holder, &confirmed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return failed(ReasonSlot, fmt.Errorf("%w: slot %s is gone", errSlotMoved, slot))
	case err != nil:
		return failed(ReasonConnectionLost, fmt.Errorf("postgres: follower: read slot %s: %w", slot, err))
	case holder == nil || uint32(*holder) != pid:
		return failed(ReasonSlot, fmt.Errorf("%w: slot %s is not held by this session's stream (pid %d)", errSlotMoved, slot, pid))
	case confirmed == nil:
		return nil
	}
	lsn, err := pglogrepl.ParseLSN(*confirmed)
	if err != nil {
		return failed(ReasonSlot, fmt.Errorf("postgres: follower: slot %s: %w", slot, err))
	}
	if lsn > at {
		return failed(ReasonSlot, fmt.Errorf("%w: slot %s had confirmed %s when the stream started from %s: the server skipped the changes between", errSlotMoved, slot, lsn, at))
	}
	return nil
}

// readWALEnd returns the end of the WAL the server has flushed: the most
// a walsender of it can have sent.
func readWALEnd(ctx context.Context, c *pgx.Conn) (pglogrepl.LSN, error) {
	var end string
	if err := c.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&end); err != nil {
		return 0, fmt.Errorf("postgres: follower: read the end of the server's WAL: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(end)
	if err != nil {
		return 0, fmt.Errorf("postgres: follower: the end of the server's WAL: %w", err)
	}
	return lsn, nil
}
