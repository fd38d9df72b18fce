package postgres

import (
	"context"
	"log/slog"
	"time"
)

// maybeSave writes the snapshot file if one is configured and the
// position needs it (position.needsSave). It runs between transactions:
// the guard then reflects exactly pos.applied, and no change is applied
// while it writes (this process's own Inserts may add keys meanwhile,
// which the file may or may not hold: the stream does not skip them in a
// later run, whose tag differs).
func (f *Follower[K]) maybeSave(ctx context.Context) error {
	if f.snapPath == "" || !f.pos.needsSave(time.Now(), f.snapEvery) {
		return nil
	}
	return f.save(ctx)
}

// save writes the snapshot file at pos.applied, in the slot instance of
// the position. A degraded guard (guarded.Feed.Degraded: a shard passes
// lookups through because it could not take a key) is not saved: the
// file has no room for the pass-through marks, and a guard restored
// without them would answer "absent" for those keys. Its file is removed
// instead, so that a restart reads the table, and the position it
// confirms becomes the one applied (position.confirmable).
func (f *Follower[K]) save(ctx context.Context) error {
	begin := time.Now()
	f.pos.saved = begin // also after a failure: not again at once
	if f.feed.Degraded() {
		if f.pos.durable != 0 || !f.degradedSaid {
			if err := removeSnapshotFile(f.snapPath); err != nil {
				return err // keep confirming the file's position
			}
			f.pos.durable = 0
		}
		if !f.degradedSaid {
			f.degradedSaid = true
			f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower does not save a degraded guard (a shard that could not take a key passes lookups through); a restart reads the table",
				slog.String("file", f.snapPath))
		}
		return nil
	}
	f.degradedSaid = false
	lsn := f.pos.applied
	h := snapFile{lsn: lsn, slot: f.pos.slot, table: f.table, key: f.key, pubVersion: f.pos.pubVersion}
	n, err := writeSnapshotFile(f.snapPath, h, f.feed.Guard())
	if err != nil {
		return err
	}
	f.pos.durable = lsn
	f.snapshots.Add(1)
	f.lastSnap.Store(time.Now().UnixNano())
	f.log.LogAttrs(ctx, slog.LevelDebug, "cuckooguard: follower saved its guard",
		slog.String("file", f.snapPath), slog.String("lsn", lsn.String()), slog.Int64("bytes", n), slog.Duration("took", time.Since(begin)))
	return nil
}

// saveOnExit writes the snapshot file when Run returns, if the guard
// reflects a position the file does not have yet.
func (f *Follower[K]) saveOnExit() {
	if f.snapPath == "" || !f.pos.valid || f.pos.applied <= f.pos.durable {
		return
	}
	if err := f.save(context.Background()); err != nil {
		f.log.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: follower could not save its guard", slog.Any("error", err))
	}
}
