package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// session is one session of a Follower: connect, start from where the
// guard stands (or from a saved guard, or a read of the table), consume
// the table's subject from the next sequence, and apply it, with a
// heartbeat through the database and the relay.
func (f *Follower[K]) session(ctx context.Context) (followed time.Duration, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	requests := f.feed.Requests()
	go func() {
		select {
		case <-requests:
			cancel(&reread{readRequest})
		case <-ctx.Done():
		}
	}()
	defer func() {
		if c := context.Cause(ctx); c != nil && c != context.Canceled {
			var re *reread
			if errors.As(c, &re) {
				err = c
			}
		}
	}()
	cctx, ccancel := context.WithTimeout(ctx, f.c.deadline)
	conn, err := pgx.ConnectConfig(cctx, f.conf)
	ccancel()
	if err != nil {
		return 0, &failure{failDatabase, fmt.Errorf("fanout: follower: connect: %w", err)}
	}
	defer conn.Close(context.WithoutCancel(ctx))
	name, err := postgres.Resolve(ctx, conn, f.table)
	if err != nil {
		return 0, &failure{failSetup, err}
	}
	if err := f.tags.ReadColumn(ctx, conn); err != nil { // Key's forms, before the Loader can be ready
		return 0, &failure{failSetup, err}
	}
	tok := Token(name)
	subject := f.c.prefix + "." + tok
	stream, err := f.js.Stream(ctx, f.c.stream)
	if err != nil {
		return 0, &failure{failSetup, fmt.Errorf("fanout: follower: stream %s (is a relay running?): %w", f.c.stream, err)}
	}
	f.state.Store(int32(postgres.Resyncing))
	if !f.pos.valid {
		if f.pending == readStart {
			if err := f.restore(ctx, stream, tok); err != nil {
				f.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: fanout follower cannot start from a saved guard; it reads the table", slog.Any("error", err))
			}
		}
		if !f.pos.valid {
			if err := f.read(ctx, conn, stream, subject); err != nil {
				return 0, err
			}
		}
	}
	f.pending = ""
	cons, err := f.js.OrderedConsumer(ctx, f.c.stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject + ".>"},
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: f.pos.seq + 1})
	if err != nil {
		return 0, &failure{failStream, fmt.Errorf("fanout: follower: consume %s: %w", subject, err)}
	}
	iter, err := cons.Messages()
	if err != nil {
		return 0, &failure{failStream, fmt.Errorf("fanout: follower: consume %s: %w", subject, err)}
	}
	defer iter.Stop()
	s := &fsession[K]{f: f, token: fmt.Sprintf("%x", rand.Uint64()), send: make(chan string, 1)}
	sctx, endSend := context.WithCancelCause(ctx)
	defer endSend(nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer endSend(nil)
	prefix := postgres.ControlPrefix(tok)
	emit := func(payload string) error {
		ectx, cancel := context.WithTimeout(sctx, f.c.deadline)
		defer cancel()
		_, err := conn.Exec(ectx, `SELECT pg_logical_emit_message(true, $1, $2)`, prefix, payload)
		return err
	}
	s.markerSent = time.Now()
	if err := emit("S " + s.token); err != nil {
		return 0, &failure{failDatabase, fmt.Errorf("fanout: follower: send the marker: %w", err)}
	}
	s.next = s.markerSent.Add(f.c.heartbeat)
	wg.Go(func() {
		for {
			select {
			case <-sctx.Done():
				return
			case p := <-s.send:
				if err := emit(p); err != nil {
					endSend(&failure{failDatabase, fmt.Errorf("fanout: follower: send a heartbeat: %w", err)})
					return
				}
			}
		}
	})
	lastSave := time.Now()
	for {
		msg, err := iter.Next(jetstream.NextMaxWait(max(s.wake(time.Now())-time.Millisecond, time.Millisecond)))
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return s.followed(now), context.Cause(ctx)
		case sctx.Err() != nil:
			return s.followed(now), context.Cause(sctx)
		case err == nil:
			if err := s.handle(msg, now); err != nil {
				return s.followed(now), err
			}
		case errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages):
		default:
			return s.followed(now), &failure{failStream, fmt.Errorf("fanout: follower: %w", err)}
		}
		s.tick(now)
		if f.c.snapWhen != nil && s.partial == nil && f.pos.skip == nil && postgres.State(f.state.Load()) == postgres.Following &&
			now.Sub(lastSave) >= f.c.snapEvery && f.c.snapWhen() {
			lastSave = now
			if err := f.save(ctx, tok); err != nil {
				f.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: fanout follower could not save its guard", slog.Any("error", err))
			}
		}
	}
}

// fsession is what a Follower's session knows of its heartbeats and of
// the transaction it is assembling.
type fsession[K comparable] struct {
	f          *Follower[K]
	token      string
	send       chan string
	markerSent time.Time
	since      time.Time // following since the marker came back
	next       time.Time // the next heartbeat is due
	seq        int64
	out        []outBeat
	partial    *txMsg // the parts of a transaction so far
}

type outBeat struct {
	seq  int64
	sent time.Time
}

// followed returns how long the session followed, at now.
func (s *fsession[K]) followed(now time.Time) time.Duration {
	if s.since.IsZero() {
		return 0
	}
	return now.Sub(s.since)
}

// wake returns how long until the session must look at its heartbeats:
// the next one is due, or the oldest one out makes the lag pass the max
// lag.
func (s *fsession[K]) wake(now time.Time) time.Duration {
	w := s.next
	if len(s.out) > 0 && postgres.State(s.f.state.Load()) == postgres.Following {
		if t := s.out[0].sent.Add(s.f.c.maxLag + time.Millisecond); t.After(now) && t.Before(w) {
			w = t
		}
	}
	return w.Sub(now)
}

// handle handles one message of the table's subject.
func (s *fsession[K]) handle(msg jetstream.Msg, now time.Time) error {
	md, err := msg.Metadata()
	if err != nil {
		return &failure{failStream, err}
	}
	seq := md.Sequence.Stream
	if strings.HasSuffix(msg.Subject(), ".ctl") {
		s.control(string(msg.Data()), now)
		if s.partial == nil {
			s.advance(seq)
		}
		return nil
	}
	m, err := decodeTx(msg.Data())
	if err != nil {
		return &failure{failStream, err}
	}
	return s.tx(m, seq)
}

// advance records that the guard reflects the stream up to seq.
func (s *fsession[K]) advance(seq uint64) {
	s.f.pos.seq = seq
	s.f.seq.Store(seq)
}

// tx takes one part of a transaction, or a reset, at stream sequence seq.
func (s *fsession[K]) tx(m txMsg, seq uint64) error {
	f := s.f
	p := &f.pos
	if m.Reset {
		return &reread{readReset}
	}
	last := m.Parts == 0 || m.Part == m.Parts-1
	if s.partial == nil {
		switch {
		case p.lsn != 0 && m.LSN <= p.lsn:
			if last {
				s.advance(seq) // published again by a successor relay: applied already
			}
			return nil
		case m.Part != 0,
			p.epoch != "" && m.Epoch != p.epoch,
			p.lsn != 0 && m.Prev != p.lsn:
			f.c.logger.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: fanout follower found a gap in the stream; it reads the table",
				slog.Uint64("seq", seq), slog.String("epoch", m.Epoch), slog.Uint64("prev", m.Prev), slog.Uint64("applied", p.lsn), slog.Int("part", m.Part))
			return &reread{readGap}
		}
		s.partial = &txMsg{Epoch: m.Epoch, LSN: m.LSN, Xid: m.Xid}
	} else if m.LSN != s.partial.LSN || m.Part != s.partial.Parts+1 {
		return &reread{readGap}
	}
	t := s.partial
	t.Parts = m.Part
	t.Creates = append(t.Creates, m.Creates...)
	t.Deletes = append(t.Deletes, m.Deletes...)
	if !last {
		return nil
	}
	s.partial = nil
	t.Tags, t.Reread = m.Tags, m.Reread
	if err := s.apply(t); err != nil {
		return err
	}
	p.epoch, p.lsn = t.Epoch, t.LSN
	s.advance(seq)
	if t.Reread {
		return &reread{readReread}
	}
	return nil
}

// apply applies one whole transaction: nothing if the last read saw it,
// else its creations less this run's tagged keys, then its deletions.
func (s *fsession[K]) apply(t *txMsg) error {
	f := s.f
	if f.pos.skip != nil && f.pos.skip.VisibleXid(t.Xid) {
		f.skipped.Add(int64(len(t.Creates) + len(t.Deletes)))
		return nil
	}
	own := f.tags.Own(t.Tags)
	change := func(text string, deleted bool) error {
		k, err := f.parse(text)
		if err != nil {
			return &failure{failStream, fmt.Errorf("fanout: follower: parse key %q: %w", text, err)}
		}
		if !deleted && own[k] > 0 {
			own[k]--
			f.skipped.Add(1)
			return nil
		}
		if err := f.feed.Apply(guarded.Change[K]{Key: k, Deleted: deleted}); err != nil {
			return &failure{failStream, err}
		}
		f.applied.Add(1)
		return nil
	}
	for _, k := range t.Creates {
		if err := change(k, false); err != nil {
			return err
		}
	}
	for _, k := range t.Deletes {
		if err := change(k, true); err != nil {
			return err
		}
	}
	return nil
}
