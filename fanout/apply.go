package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// fsession is what a Follower's session knows of its heartbeats, of the
// consumer's deliveries and of the transaction it is assembling.
type fsession[K comparable] struct {
	f          *Follower[K]
	token      string
	send       chan string
	markerSent time.Time
	asOf       time.Time // when the last marker or heartbeat back was sent: every change committed before it is applied
	since      time.Time // following since the marker came back
	next       time.Time // the next heartbeat is due
	seq        int64
	out        []outBeat
	consumed   uint64 // the consumer's sequence of the last message delivered
	partial    *txMsg // the parts of a transaction so far
}

type outBeat struct {
	seq  int64
	sent time.Time
}

// handle handles one message of the table's subject, delivered at now.
func (s *fsession[K]) handle(ctx context.Context, msg jetstream.Msg, now time.Time) error {
	md, err := msg.Metadata()
	if err != nil {
		return &failure{failStream, err}
	}
	// Each delivery takes the consumer's next sequence: one that skips
	// some lost messages on the way (a connection lost with them in it).
	// The next session resumes from the last one applied.
	if md.Sequence.Consumer != s.consumed+1 {
		return &failure{failStream, fmt.Errorf("fanout: follower: the consumer skipped deliveries %d to %d", s.consumed+1, md.Sequence.Consumer-1)}
	}
	s.consumed = md.Sequence.Consumer
	s.f.backlog.Store(md.NumPending)
	s.f.lastMsg.Store(now.UnixNano())
	seq := md.Sequence.Stream
	if strings.HasSuffix(msg.Subject(), ".ctl") {
		c, err := decodeCtl(msg.Data())
		if err != nil {
			return &failure{failStream, err}
		}
		if s.f.pos.unread {
			// The table's first message: everything up to it is in the read.
			if err := s.readAt(ctx, seq, c.Epoch, c.Prev, c.Term); err != nil {
				return err
			}
		}
		return s.ctl(c, seq, now)
	}
	m, err := decodeTx(msg.Data())
	if err != nil {
		return &failure{failStream, err}
	}
	if err := s.f.foreign("a message", msg.Subject(), m.DB); err != nil {
		return err
	}
	if s.f.pos.unread {
		// The table's first message, a reset or a transaction: it and
		// everything before it are in the read.
		if err := s.readAt(ctx, seq, m.Epoch, m.LSN, m.Term); err != nil {
			return err
		}
		if m.Reset || m.Parts == 0 || m.Part == m.Parts-1 {
			return nil
		}
	}
	return s.tx(m, seq)
}

// readAt reads the table at the first message that came (see
// Follower.readAt), and sends a new marker: the session's first one may
// have gone into the database before the relay's slot existed, and would
// never come back.
func (s *fsession[K]) readAt(ctx context.Context, seq uint64, epoch string, lsn, term uint64) error {
	if err := s.f.readAt(ctx, seq, epoch, lsn, term); err != nil {
		return err
	}
	s.token = fmt.Sprintf("%x", rand.Uint64())
	s.out, s.seq = nil, 0
	s.markerSent = time.Now()
	select {
	case s.send <- "S " + s.token:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// advance records that the guard reflects the stream up to seq.
func (s *fsession[K]) advance(seq uint64) {
	s.f.pos.seq = seq
	s.f.seq.Store(seq)
}

// fenced reports whether a message of term comes from a relay whose lease
// lapsed: a newer term was seen. It is ignored, and passed by.
func (s *fsession[K]) fenced(term, seq uint64) bool {
	p := &s.f.pos
	if term >= p.term {
		p.term = term
		return false
	}
	s.f.fenced.Add(1)
	if s.partial == nil {
		s.advance(seq)
	}
	return true
}

// gap ends the session for a read of the table: messages are missing.
func (s *fsession[K]) gap(seq uint64, what string, epoch string, prev uint64) error {
	p := &s.f.pos
	s.f.c.logger.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: fanout follower found a gap in the stream; it reads the table",
		slog.String("at", what), slog.Uint64("seq", seq), slog.String("epoch", epoch), slog.Uint64("prev", prev),
		slog.String("applied_epoch", p.epoch), slog.Uint64("applied", p.lsn))
	return &reread{readGap}
}

// ctl takes a marker or heartbeat at stream sequence seq: it says where the
// table's transactions stood when it came, which must be where this
// follower stands.
func (s *fsession[K]) ctl(c ctlMsg, seq uint64, now time.Time) error {
	if s.fenced(c.Term, seq) {
		return nil
	}
	p := &s.f.pos
	switch {
	case s.partial != nil: // the rest of a transaction's parts never came
		return s.gap(seq, "control", c.Epoch, c.Prev)
	case p.epoch == "":
		// The table was read while the stream held none of its
		// transactions: whatever came before this is in the read.
		p.epoch, p.lsn = c.Epoch, c.Prev
	case c.Epoch != p.epoch || c.Prev != p.lsn:
		return s.gap(seq, "control", c.Epoch, c.Prev)
	}
	if err := s.proven(c); err != nil {
		s.advance(seq) // read: the next session resumes after it
		return err
	}
	lost := s.control(c.Payload, now)
	s.advance(seq)
	s.reached(c.LSN, c.Tok)
	if lost {
		// The session's own heartbeat came back and its marker, sent
		// before it, did not: the marker is in no stream (the relay
		// started again past it: a reset, a database's restart). Waiting
		// would pass lookups through for good; a new session sends
		// another.
		return &failure{failStream, errors.New("fanout: follower: a heartbeat came back before the session's marker, which is in no stream (the relay started again past it)")}
	}
	return nil
}

// proven returns the failure that ends the session at control message c,
// one of this session's own markers or heartbeats, if c does not prove
// that the relay streams the table that the name names: its transaction
// saw another table under the name, or another publication (a rename
// swap, a DROP and CREATE, a publication changed: the changes since may
// be missing from the stream), or it carries no identity to compare (a
// relay of an earlier version). Only this session's own can make the
// Loader ready, so only they are judged. The session ends at once, so the
// Loader passes through; the next resumes after c, and reads the table at
// the relay's reset.
func (s *fsession[K]) proven(c ctlMsg) error {
	switch {
	case !s.own(c.Payload):
		return nil
	case c.Seen == "" || c.Table == "":
		return &failure{failTable, errors.New("fanout: follower: the relay does not say which table it streams (a relay of an earlier version?): lookups pass through")}
	case c.Seen != c.Table:
		return &failure{failTable, fmt.Errorf("fanout: follower: a heartbeat found another table under the name %s, or another publication, than the relay streams (identity %s; the relay's %s)",
			s.f.table, c.Seen, c.Table)}
	}
	return nil
}

// own reports whether payload is a marker or heartbeat of this session.
func (s *fsession[K]) own(payload string) bool {
	op, rest, _ := strings.Cut(payload, " ")
	switch op {
	case "S":
		return rest == s.token
	case "H":
		token, _, _ := strings.Cut(rest, "-")
		return token == s.token
	}
	return false
}

// tx takes one part of a transaction, or a reset, at stream sequence seq.
func (s *fsession[K]) tx(m txMsg, seq uint64) error {
	if s.partial != nil && m.Term > s.partial.Term {
		s.partial = nil // a relay of a newer term publishes it again, from its first part
	}
	if m.Reset && m.Rewound && m.Term < s.f.pos.term {
		// The relay found the database restored to an earlier point: the
		// terms the stream holds are of a history it no longer has, and
		// its own are smaller. Taking the reset only makes this follower
		// read the table; from then on its terms are the newest.
		s.f.c.logger.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: fanout follower's database went back to an earlier point (a restore); it reads the table",
			slog.Uint64("term", m.Term), slog.Uint64("was", s.f.pos.term))
		s.f.pos.term = m.Term
	}
	if s.fenced(m.Term, seq) {
		return nil
	}
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
			p.epoch != "" && m.Prev != p.lsn:
			return s.gap(seq, "transaction", m.Epoch, m.Prev)
		}
		s.partial = &txMsg{Epoch: m.Epoch, Term: m.Term, LSN: m.LSN, Xid: m.Xid, Tok: m.Tok}
	} else if m.LSN != s.partial.LSN || m.Part != s.partial.Parts+1 {
		return s.gap(seq, "part", m.Epoch, m.Prev)
	}
	t := s.partial
	t.Parts = m.Part
	t.Creates = append(t.Creates, m.Creates...)
	t.Deletes = append(t.Deletes, m.Deletes...)
	t.Tags = append(t.Tags, m.Tags...)
	if !last {
		return nil
	}
	s.partial = nil
	t.Reread = m.Reread
	if err := s.apply(t); err != nil {
		return err
	}
	p.epoch, p.lsn = t.Epoch, t.LSN
	s.advance(seq)
	if t.Reread {
		return &reread{readReread}
	}
	s.reached(t.LSN, t.Tok)
	return nil
}

// reached reports to the Loader that the guard holds every change of the
// table committed up to lsn (a transaction's, or a control message's,
// which came after every transaction of the table before it): lookups
// under a token at or before it no longer wait (postgres.WriteToken).
// Where the database's tokens are of another stream than its positions
// (follow.Origin.TokenStream: mysql.WriteToken's GTID sequence numbers),
// the message's tok is that position.
func (s *fsession[K]) reached(lsn, tok uint64) {
	stream, pos := s.f.origin.Token, lsn
	if s.f.origin.TokenStream != "" {
		stream, pos = s.f.origin.TokenStream, tok
	}
	if pos == 0 {
		return
	}
	if t, err := guarded.NewToken(stream, pos); err == nil {
		s.f.feed.Reached(t)
	}
}

// apply applies one whole transaction: nothing if the last read saw it,
// else its creations less this run's tagged keys, then its deletions.
func (s *fsession[K]) apply(t *txMsg) error {
	f := s.f
	if f.pos.skip != nil && f.pos.skip.Saw(t.LSN, t.Xid) {
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
