package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/postgres"
)

// read reads the table into a fresh guard, and sets the position to the
// table's last transaction in the stream before the read (or, if the
// stream holds none, to the stream's last message), whose snapshot tells
// which transactions after it the read saw (skipped until the session's
// marker is back). The position is taken before the snapshot, and the
// relay publishes a transaction only once it is visible to new snapshots
// (postgres.Source), so the snapshot sees every transaction up to the
// position; one that commits after the snapshot is published after the
// position: none is lost between them.
func (f *Follower[K]) read(ctx context.Context, conn *pgx.Conn, in instance, rt route) error {
	p := position{mark: mark{db: f.db, in: in}}
	subject := rt.subject(f.c.prefix)
	stream, err := f.js.Stream(ctx, in.name)
	if err != nil {
		return &failure{failStream, fmt.Errorf("fanout: follower: stream %s: %w", in.name, err)}
	}
	si := stream.CachedInfo()
	if !instanceOf(si).same(in) {
		return &reread{readStream}
	}
	last, err := stream.GetLastMsgForSubject(ctx, subject+".tx")
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// None of the table's transactions is in the stream: whatever
		// comes after its last message now is new.
		p.seq = si.State.LastSeq
	case err != nil:
		return &failure{failStream, fmt.Errorf("fanout: follower: read the stream's last message of %s: %w", subject, err)}
	default:
		m, err := decodeTx(last.Data)
		if err != nil {
			return &failure{failStream, err}
		}
		if m.DB != f.db.Token() {
			return &failure{failSetup, fmt.Errorf("fanout: follower: the last message on %s comes from database %s; this follower's is %s (%s): refused",
				subject, m.DB, f.db.Token(), f.db)}
		}
		p.seq, p.epoch, p.lsn, p.term = last.Sequence, m.Epoch, m.LSN, m.Term
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
