package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/nats-io/nats.go/jetstream"
)

// place finds where a read of the table starts: the table's last
// transaction in the stream, or, if the stream holds none of its
// transactions (a relay that has not published its reset yet, a quiet table
// whose messages aged out), nothing: the read then waits for the table's
// first message (see readAt), rather than read the table now and again at
// the relay's reset.
func (f *Follower[K]) place(ctx context.Context, in instance, rt route) (position, bool, error) {
	p := position{mark: mark{db: f.origin, in: in}}
	subject := rt.subject(f.c.prefix)
	stream, err := f.js.Stream(ctx, in.name)
	if err != nil {
		return p, false, &failure{failStream, fmt.Errorf("fanout: follower: stream %s: %w", in.name, err)}
	}
	// The stream's end first, then the table's last message: a
	// transaction published between the two is after the end.
	si := stream.CachedInfo()
	if !instanceOf(si).same(in) {
		return p, false, &reread{readStream}
	}
	last, err := stream.GetLastMsgForSubject(ctx, subject+".tx")
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		p.seq = si.State.LastSeq
		return p, false, nil
	case err != nil:
		return p, false, &failure{failStream, fmt.Errorf("fanout: follower: read the stream's last message of %s: %w", subject, err)}
	}
	m, err := decodeTx(last.Data)
	if err != nil {
		return p, false, &failure{failStream, err}
	}
	if err := f.foreign("the last message", subject, m.DB); err != nil {
		return p, false, err
	}
	p.seq, p.epoch, p.lsn, p.term = last.Sequence, m.Epoch, m.LSN, m.Term
	return p, true, nil
}

// read reads the table into a fresh guard, and sets the position to p,
// taken before the read. The snapshot tells which transactions after p the
// read saw (skipped until the session's marker is back). The relay
// publishes a transaction only once it is visible to new snapshots
// (follow.Source), so the snapshot sees every transaction up to p; one
// that commits after the snapshot is published after p: none is lost
// between them.
func (f *Follower[K]) read(ctx context.Context, conn follow.Session, p position) error {
	begin := time.Now()
	var sn follow.Seen
	var n int64
	err := f.feed.Resync(ctx, func(ctx context.Context, add func(K) error) error {
		var err error
		sn, n, err = conn.Read(ctx, func(text string) error {
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
	p.valid, p.skip, p.unread = true, sn, false
	f.pos = p
	f.seq.Store(p.seq)
	why := f.pending
	f.pending = ""
	f.mu.Lock()
	f.reads[why]++
	f.mu.Unlock()
	f.c.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: fanout follower read the table",
		slog.String("reason", why), slog.Int64("keys", n), slog.Duration("took", time.Since(begin)), slog.Uint64("from_seq", p.seq+1))
	return nil
}

// readAt reads the table at the first message of an unread position
// (place found none of the table's transactions): a reset, a transaction,
// or a control message, at stream sequence seq, all of whose transactions
// up to it are visible; on a connection of its own, the session's sending
// heartbeats.
func (f *Follower[K]) readAt(ctx context.Context, seq uint64, epoch string, lsn, term uint64) error {
	cctx, cancel := context.WithTimeout(ctx, f.c.deadline)
	conn, err := f.db.Connect(cctx, f.table, f.key)
	cancel()
	if err != nil {
		return &failure{failDatabase, fmt.Errorf("fanout: follower: connect: %w", err)}
	}
	defer conn.Close()
	p := f.pos
	p.seq, p.epoch, p.lsn, p.term = seq, epoch, lsn, max(p.term, term)
	return f.read(ctx, conn, p)
}

// foreign returns the failure of what (a message, on subject) published
// from database db, if that is not this follower's database, and nil if
// it is.
func (f *Follower[K]) foreign(what, subject, db string) error {
	if want := f.origin.Token; db != want {
		return &failure{failSetup, fmt.Errorf("fanout: follower: %s on %s comes from database %s; this follower's is %s (%s): refused", what, subject, db, want, f.origin)}
	}
	return nil
}
