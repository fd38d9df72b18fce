package fanout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/guard"
)

// A saved guard is an object of the bucket named after the table's route
// (database, relay, table), holding the guard (guard.Guard.WriteTo), with
// headers that carry the mark it reflects: the database, the stream
// instance and sequence, and the epoch, LSN and term of the table's
// messages up to it. The bucket holds one object per table: each save
// replaces the last.

// restore installs the newest guard saved for the table, if it is of this
// database and of this instance of the stream, and the stream still holds
// every message after it, and sets the position to it.
func (f *Follower[K]) restore(ctx context.Context, in instance, rt route) error {
	if f.c.bucket == "" {
		return nil
	}
	obs, err := f.js.ObjectStore(ctx, f.c.bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	name := rt.object()
	info, err := obs.GetInfo(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	m, err := markOf(info.Headers)
	switch {
	case err != nil:
		return fmt.Errorf("saved guard %s: %w", name, err)
	case !m.db.Same(f.origin):
		return fmt.Errorf("saved guard %s is of %s; this follower's is %s", name, m.db, f.origin)
	case !m.in.same(in):
		return fmt.Errorf("saved guard %s stands in %s; the stream is now %s (deleted and made again)", name, m.in, in)
	}
	si, err := streamInfo(ctx, f.js, in.name, f.c.deadline)
	if err != nil {
		return err
	}
	if !holdsAfter(si, m.seq) {
		return fmt.Errorf("saved guard %s stands at sequence %d; the stream holds %d to %d", name, m.seq, si.State.FirstSeq, si.State.LastSeq)
	}
	r, err := obs.Get(ctx, name)
	if err != nil {
		return err
	}
	defer r.Close()
	begin := time.Now()
	g, err := guard.Restore(r, guard.Like(f.feed.Guard()))
	if err != nil {
		return fmt.Errorf("saved guard %s: %w", name, err)
	}
	if err := f.feed.Replace(g); err != nil {
		g.Close()
		return err
	}
	// Inserts before the swap added their keys to the guard it closed:
	// their tags must not skip them.
	f.tags.NewRun()
	f.pos = position{valid: true, mark: m}
	f.seq.Store(m.seq)
	f.restored.Add(1)
	f.c.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: fanout follower starts from a saved guard",
		slog.Uint64("seq", m.seq), slog.Int("keys", g.Len()), slog.Duration("took", time.Since(begin)))
	return nil
}

// save writes the guard, with where it stands, to the bucket: between
// transactions, after the read's skips are over, and never a degraded
// guard (guarded.Feed.Degraded), which a saved copy would get wrong.
func (f *Follower[K]) save(ctx context.Context, rt route) error {
	if f.feed.Degraded() {
		return nil
	}
	obs, err := f.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: f.c.bucket,
		Description: "cuckooguard: guards saved by fanout followers, one per database, relay and table"})
	if err != nil {
		return err
	}
	g := f.feed.Guard()
	pr, pw := io.Pipe()
	go func() {
		_, err := g.WriteTo(pw)
		pw.CloseWithError(err)
	}()
	_, err = obs.Put(ctx, jetstream.ObjectMeta{Name: rt.object(), Headers: f.pos.mark.headers()}, pr)
	pr.CloseWithError(err)
	if err != nil {
		return err
	}
	f.saved.Add(1)
	return nil
}
