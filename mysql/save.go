package mysql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
)

// maybeSave writes the snapshot file if one is configured, the interval
// has passed since the last try ended, and the guard reflects a position the
// file does not have. It runs between transactions (at a commit): the
// guard then reflects exactly the binlog up to the resume position, and no
// change is applied while it writes. (This process's own Inserts may add
// keys meanwhile, which the file may or may not hold: a later process,
// whose tags differ, applies their inserts from the stream.) A failed
// save is logged, and the session goes on.
func (f *Follower[K]) maybeSave(now time.Time) {
	if f.snapPath == "" || f.resume == nil || now.Sub(f.saved) < f.snapEvery || f.durable == f.resume.mark() {
		return
	}
	if err := f.save(); err != nil {
		f.log.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: follower could not save its guard", slog.Any("error", err))
	}
}

// save writes the snapshot file at the resume position. A degraded guard
// (guarded.Feed.Degraded: a shard passes lookups through because it could
// not take a key) is not saved, and its file is removed instead, so that
// a restart reads the table.
func (f *Follower[K]) save() error {
	begin := time.Now()
	// The interval counts from the end of the last save, also a failed
	// one: a save costs the stream its time (WriteTo of the whole guard),
	// and saves back to back would leave it none.
	defer func() { f.saved = time.Now() }()
	if f.feed.Degraded() {
		if err := removeSnapshotFile(f.snapPath); err != nil {
			return err
		}
		f.durable = positionMark{}
		if !f.degradedSaid {
			f.degradedSaid = true
			f.log.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: follower does not save a degraded guard (a shard that could not take a key passes lookups through); a restart reads the table",
				slog.String("file", f.snapPath))
		}
		return nil
	}
	f.degradedSaid = false
	h := snapFile{at: *f.resume, table: f.table, key: f.key}
	for _, k := range f.holds.uncancelled() {
		// A key that does not read back as itself cannot be released by
		// a later process: it stays, a false positive.
		if text := f.text(k); len(text) < 1<<16 {
			if back, err := f.parse(text); err == nil && back == k {
				h.held = append(h.held, text)
			}
		}
	}
	n, err := writeSnapshotFile(f.snapPath, h, f.feed.Guard())
	if err != nil {
		return err
	}
	f.durable = f.resume.mark()
	f.snapshots.Add(1)
	f.log.LogAttrs(context.Background(), slog.LevelDebug, "cuckooguard: follower saved its guard",
		slog.String("file", f.snapPath), slog.String("position", f.resume.String()), slog.Int64("bytes", n),
		slog.Int("held", len(h.held)), slog.Duration("took", time.Since(begin)))
	return nil
}

// saveOnExit writes the snapshot file when Run returns, if the guard
// reflects a position the file does not have.
func (f *Follower[K]) saveOnExit() {
	if f.snapPath == "" || f.resume == nil || f.durable == f.resume.mark() {
		return
	}
	if err := f.save(); err != nil {
		f.log.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: follower could not save its guard", slog.Any("error", err))
	}
}

// restore installs the guard of the snapshot file, with its held
// deletions, and makes its position the one to resume from, if nothing
// the server says refutes it (resumePoint.refuse; the stream checks the
// rest). Otherwise it leaves the Loader's guard alone, and says in
// readReason why the session reads the table.
func (f *Follower[K]) restore(ctx context.Context, src source, col column) {
	begin := time.Now()
	h, g, err := readSnapshotFile(f.snapPath, guard.Like(f.feed.Guard()))
	read := time.Since(begin)
	fallback := func(why string) {
		if g != nil {
			g.Close()
		}
		level := slog.LevelWarn
		if errors.Is(err, os.ErrNotExist) {
			level = slog.LevelInfo // the first start of a process
		}
		f.readReason = "snapshot file: " + why
		f.log.LogAttrs(ctx, level, "cuckooguard: follower cannot start from its snapshot file; it reads the table",
			slog.String("file", f.snapPath), slog.String("reason", why))
	}
	if err != nil {
		fallback(err.Error())
		return
	}
	if h.table != f.table || h.key != f.key || h.at.col.schema != col.schema {
		fallback(fmt.Sprintf("the file is of column %s of %s.%s", h.key, h.at.col.schema, h.table))
		return
	}
	if why := h.at.refuse(src, col); why != "" {
		fallback(why)
		return
	}
	held := make([]K, 0, len(h.held))
	for _, text := range h.held {
		k, err := f.parse(text)
		if err != nil {
			fallback(fmt.Sprintf("held deletion %q: %v", text, err))
			return
		}
		held = append(held, k)
	}
	if err := f.feed.Replace(g); err != nil {
		fallback(err.Error())
		return
	}
	g = nil // the Loader's now
	// The Inserts that ran before Replace added their keys to the guard it
	// closed, and tagged their writes with the run's tag until now: those
	// must be applied from the stream, not skipped. Replace waited for
	// them (and held the later ones back), so a new run tells them apart;
	// an Insert that starts between Replace and here gets one extra copy
	// (applied, and added), never none.
	f.tags.NewRun()
	p := h.at
	f.resume = &p
	f.holds.drop()
	f.holds.hold(held)
	f.durable = p.mark()
	f.restores.Add(1)
	f.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: follower starts from its snapshot file",
		slog.String("file", f.snapPath), slog.String("position", p.String()), slog.Int("keys", f.feed.Guard().Len()), slog.Int("held", len(held)),
		slog.Duration("read", read), slog.Duration("took", time.Since(begin)))
}

// positionMark tells two positions apart: the file and the end.
type positionMark struct {
	file string
	end  uint32
}

// mark is p's positionMark.
func (p *resumePoint) mark() positionMark { return positionMark{p.file, p.end} }
