package fanout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// A saved guard is an object of the bucket named after the table's token,
// holding the guard (guard.Guard.WriteTo), with headers that say where in
// the stream it stands: the sequence of the last message it reflects, and
// the epoch and LSN of the table's last transaction it reflects.
const (
	headerSeq   = "Cuckooguard-Seq"
	headerEpoch = "Cuckooguard-Epoch"
	headerLSN   = "Cuckooguard-Lsn"
)

// read reads the table into a fresh guard, and sets the position to the
// table's last transaction in the stream before the read, whose snapshot
// tells which transactions after it the read saw (skipped until the
// session's marker is back). A transaction that commits after the read's
// snapshot is published after that last one: none is lost between them.
func (f *Follower[K]) read(ctx context.Context, conn *pgx.Conn, stream jetstream.Stream, subject string) error {
	var p position
	last, err := stream.GetLastMsgForSubject(ctx, subject+".tx")
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return &failure{failStream, fmt.Errorf("fanout: follower: read the stream's last message of %s: %w", subject, err)}
	default:
		m, err := decodeTx(last.Data)
		if err != nil {
			return &failure{failStream, err}
		}
		p.seq, p.epoch, p.lsn = last.Sequence, m.Epoch, m.LSN
	}
	begin := time.Now()
	var sn postgres.Snapshot
	var n int64
	err = f.feed.Resync(ctx, func(ctx context.Context, add func(K) error) error {
		var err error
		sn, n, err = postgres.ReadTable(ctx, conn, f.table, f.key, func(text string) error {
			k, err := f.parse(text)
			if err != nil {
				return fmt.Errorf("parse key %q: %w", text, err)
			}
			return add(k)
		})
		return err
	})
	if err != nil {
		return &failure{failDatabase, fmt.Errorf("fanout: follower: read the table: %w", err)}
	}
	p.valid, p.skip = true, &sn
	f.pos = p
	f.seq.Store(p.seq)
	why := f.pending
	f.mu.Lock()
	f.reads[why]++
	f.mu.Unlock()
	f.c.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: fanout follower read the table",
		slog.String("reason", why), slog.Int64("keys", n), slog.Duration("took", time.Since(begin)), slog.Uint64("from_seq", p.seq+1))
	return nil
}

// restore installs the newest guard saved for the table, if the stream
// still holds every message after it, and sets the position to it.
func (f *Follower[K]) restore(ctx context.Context, stream jetstream.Stream, tok string) error {
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
	info, err := obs.GetInfo(ctx, tok)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var p position
	if p.seq, err = strconv.ParseUint(info.Headers.Get(headerSeq), 10, 64); err != nil {
		return fmt.Errorf("saved guard %s: sequence: %w", tok, err)
	}
	if p.lsn, err = strconv.ParseUint(info.Headers.Get(headerLSN), 10, 64); err != nil {
		return fmt.Errorf("saved guard %s: LSN: %w", tok, err)
	}
	p.epoch = info.Headers.Get(headerEpoch)
	si, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	if si.State.FirstSeq > p.seq+1 && si.State.Msgs > 0 {
		return fmt.Errorf("saved guard %s stands at sequence %d; the stream begins at %d", tok, p.seq, si.State.FirstSeq)
	}
	r, err := obs.Get(ctx, tok)
	if err != nil {
		return err
	}
	defer r.Close()
	begin := time.Now()
	g, err := guard.Restore(r, guard.Like(f.feed.Guard()))
	if err != nil {
		return fmt.Errorf("saved guard %s: %w", tok, err)
	}
	if err := f.feed.Replace(g); err != nil {
		g.Close()
		return err
	}
	// Inserts before the swap added their keys to the guard it closed:
	// their tags must not skip them.
	f.tags.NewRun()
	p.valid = true
	f.pos = p
	f.seq.Store(p.seq)
	f.restored.Add(1)
	f.c.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: fanout follower starts from a saved guard",
		slog.Uint64("seq", p.seq), slog.Int("keys", g.Len()), slog.Duration("took", time.Since(begin)))
	return nil
}

// save writes the guard, with where it stands, to the bucket: between
// transactions, after the read's skips are over, and never a degraded
// guard (guarded.Feed.Degraded), which a saved copy would get wrong.
func (f *Follower[K]) save(ctx context.Context, tok string) error {
	if f.feed.Degraded() {
		return nil
	}
	obs, err := f.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: f.c.bucket})
	if err != nil {
		return err
	}
	g := f.feed.Guard()
	pr, pw := io.Pipe()
	go func() {
		_, err := g.WriteTo(pw)
		pw.CloseWithError(err)
	}()
	h := nats.Header{}
	h.Set(headerSeq, strconv.FormatUint(f.pos.seq, 10))
	h.Set(headerEpoch, f.pos.epoch)
	h.Set(headerLSN, strconv.FormatUint(f.pos.lsn, 10))
	_, err = obs.Put(ctx, jetstream.ObjectMeta{Name: tok, Headers: h}, pr)
	pr.CloseWithError(err)
	if err != nil {
		return err
	}
	f.saved.Add(1)
	return nil
}
