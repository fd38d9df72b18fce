package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/nats-io/nats.go/jetstream"
)

// headerRoom is what a message's headers may take of the broker's limit.
const headerRoom = 512

// maxInFlight is how many messages the relay publishes ahead of
// JetStream's acknowledgements.
const maxInFlight = 1024

// relayHandler publishes what the relay's Source streams, for one term.
type relayHandler struct {
	r      *Relay
	lease  follow.Lease
	end    context.CancelCauseFunc // ends the term
	tables []relayTable
	routes map[string]int           // control route: table
	limit  int                      // the largest message the stream takes
	in     atomic.Pointer[instance] // the stream's instance the session started in

	// The messages published and not acknowledged yet, oldest first: the
	// relay publishes ahead of the acknowledgements, a round trip to the
	// stream per transaction being what would bound its throughput, and
	// confirms a transaction's LSN once every message up to its own is
	// acknowledged. One that fails ends the session: a message after it may
	// be in the stream while it is not, and the followers find that gap
	// by the Prev chain and read the table.
	inFlight []inFlight
}

// inFlight is a message published and not acknowledged yet: once it and
// every message before it are, lsn (if not 0) may be confirmed.
type inFlight struct {
	ack jetstream.PubAckFuture // nil: nothing to wait for
	lsn uint64
}

// relayTable is where a table's messages stand in the stream.
type relayTable struct {
	route    route
	subject  string // route.subject(prefix)
	epoch    string
	last     uint64 // the LSN of its last transaction in the stream
	version  string
	identity follow.TableIdentity // of the table the session streams
}

// Start makes the stream if it is gone, reads where each table's messages
// stand in it, and publishes a reset for a table whose messages cannot
// continue: the slot was made anew, the stream holds nothing of it, its
// name names another table or its publication changed, or the database
// went back to an earlier point (rewound).
func (h *relayHandler) Start(ctx context.Context, st follow.Start) error {
	if err := h.fence(); err != nil {
		return err
	}
	s, err := h.r.ensureStream(ctx)
	if err != nil {
		if errors.Is(err, errStreamRefused) {
			h.end(err) // Relay.Run returns it
		}
		return err
	}
	in := instanceOf(s.CachedInfo())
	// The largest message, less room for its headers (the message id),
	// which count towards the broker's limit too.
	h.limit = int(h.r.nc.MaxPayload())
	if m := s.CachedInfo().Config.MaxMsgSize; m > 0 {
		h.limit = min(h.limit, int(m))
	}
	h.limit -= headerRoom
	h.in.Store(&in)
	h.inFlight = nil // a session's: what the last one left unacknowledged it publishes again
	h.tables = make([]relayTable, len(st.Tables))
	h.routes = make(map[string]int, len(st.Tables))
	relay := Token(h.r.name)
	for i, name := range st.Tables {
		rt := route{db: st.Origin, relay: relay, table: Token(name)}
		t := relayTable{route: rt, subject: rt.subject(h.r.c.prefix), version: st.Versions[i], identity: st.Identities[i]}
		h.routes[rt.control()] = i
		last, err := s.GetLastMsgForSubject(ctx, t.subject+".tx")
		var m txMsg
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return fmt.Errorf("fanout: relay: read the last message of %s: %w", t.subject, err)
		default:
			if m, err = decodeTx(last.Data); err != nil {
				m = txMsg{} // unreadable: start the table's messages anew
			}
		}
		rewound, err := h.rewound(ctx, s, t.subject, &m, st)
		if err != nil {
			return err
		}
		renamed := m.OID != 0 && m.OID != t.identity.ID
		if st.Reset || m.Epoch == "" || m.Version != st.Versions[i] || renamed || rewound {
			if rewound {
				// Another look at the lease after reading the stream: a
				// relay that hung meanwhile may be reading a successor's
				// terms, and must not call that a restore.
				if err := h.fence(); err != nil {
					return err
				}
			}
			t.epoch = fmt.Sprintf("%x/%x", st.Pos, rand.Uint64())
			t.last = uint64(st.Pos)
			reset := txMsg{Epoch: t.epoch, Term: h.lease.Term(), DB: rt.db.Token, LSN: t.last, Reset: true, Reread: true, Version: t.version,
				OID: t.identity.ID, Rewound: rewound}
			if err := h.send(ctx, t.subject+".tx", &reset); err != nil {
				return err
			}
			h.r.resets.Add(1)
			level := slog.LevelInfo
			if rewound {
				level = slog.LevelWarn
			}
			h.r.c.logger.LogAttrs(ctx, level, "cuckooguard: relay reset a table: its followers read it again",
				slog.String("table", name), slog.Bool("new_slot", st.Reset), slog.Bool("version_changed", m.Epoch != "" && m.Version != st.Versions[i]),
				slog.Bool("table_changed", renamed), slog.Bool("database_rewound", rewound))
		} else {
			t.epoch, t.last = m.Epoch, m.LSN
		}
		h.tables[i] = t
	}
	h.r.src.Confirm(st.Pos)
	return nil
}

// rewound reports whether the table's messages in the stream, m the last
// transaction's (zero if none) and the last control message's, come from
// a history that the database no longer has: it was restored to an
// earlier point (a point-in-time restore, or a copy of its data
// directory), with the same system identifier. Within one history a term
// is a transaction id taken when the lease was, larger than every term
// before it, and every LSN published is behind the WAL's end. So a
// message of a term above this lease's, or of an LSN past the WAL's
// end when the session began (st.WALEnd), is from a lost history, if
// this relay still holds its lease (the caller looks again before it
// says so: a relay that lost its lease may read its successor's terms).
// A restore that the database outgrew before the relay looked (more
// transactions and WAL since it than were lost) is not recognised.
func (h *relayHandler) rewound(ctx context.Context, s jetstream.Stream, subject string, m *txMsg, st follow.Start) (bool, error) {
	term := m.Term
	last, err := s.GetLastMsgForSubject(ctx, subject+".ctl")
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return false, fmt.Errorf("fanout: relay: read the last message of %s: %w", subject, err)
	default:
		if c, err := decodeCtl(last.Data); err == nil {
			term = max(term, c.Term)
		}
	}
	return term > h.lease.Term() || (m.Epoch != "" && m.DB == st.Origin.Token && m.LSN > st.End), nil
}

// fence returns errLeaseLapsed, and ends the term, once the lease may
// have lapsed: nothing is published after that.
func (h *relayHandler) fence() error {
	if h.lease.Held(time.Now()) {
		return nil
	}
	h.end(errLeaseLapsed)
	return errLeaseLapsed
}

// Commit publishes one committed transaction: each table's part of it
// that the stream does not hold yet, then the followers' control
// messages, and confirms it once JetStream acknowledged them all and
// every message before them. It waits for the acknowledgements only to
// keep fewer than maxInFlight messages out, and at each control message
// (a heartbeat or a marker: at least once a heartbeat), so that the slot
// is confirmed as often.
func (h *relayHandler) Commit(ctx context.Context, c *follow.Commit) error {
	if err := h.fence(); err != nil {
		return err
	}
	for i := range c.Tables {
		ch, t := &c.Tables[i], &h.tables[i]
		if !ch.Touched() || c.Pos <= t.last {
			continue // nothing, or published before this session
		}
		m := txMsg{Epoch: t.epoch, Term: h.lease.Term(), DB: t.route.db.Token, LSN: c.Pos, Prev: t.last, Xid: c.Xid, Tok: c.Token,
			Creates: ch.Creates, Deletes: ch.Deletes, Tags: c.Tags, Reread: ch.Truncated || ch.Incomplete, Version: t.version, OID: t.identity.ID}
		for _, p := range split(m, h.limit) {
			b, err := p.encode()
			if err != nil {
				return err
			}
			if err := h.publish(ctx, t.subject+".tx", b, jetstream.WithMsgID(p.id())); err != nil {
				return err
			}
		}
		t.last = c.Pos
	}
	controls := false
	for _, ctl := range c.Controls {
		i, ok := h.routes[ctl.Route]
		if !ok {
			continue // a follower of another relay, or of a table this relay does not stream
		}
		t := &h.tables[i]
		m := ctlMsg{Epoch: t.epoch, Term: h.lease.Term(), Prev: t.last, LSN: c.Pos, Tok: c.Token, Payload: ctl.Payload, Table: t.identity.String()}
		if !ctl.Table.IsZero() {
			m.Seen = ctl.Table.String()
			if ctl.Table != t.identity {
				// The follower's transaction found another table under
				// the name, or another publication: its follower stops
				// following at this message, and the Source's own
				// heartbeat decides whether the session streams the
				// wrong table (the follower's transaction may be older
				// than the session).
				h.r.src.Recheck()
			}
		}
		b, err := m.encode()
		if err != nil {
			return err
		}
		if err := h.publish(ctx, t.subject+".ctl", b); err != nil {
			return err
		}
		controls = true
	}
	h.inFlight = append(h.inFlight, inFlight{lsn: c.Pos})
	if controls {
		return h.reap(ctx, 0)
	}
	return h.reap(ctx, maxInFlight)
}

// publish publishes b on subject without waiting for the acknowledgement.
func (h *relayHandler) publish(ctx context.Context, subject string, b []byte, opts ...jetstream.PublishOpt) error {
	if err := h.reap(ctx, maxInFlight-1); err != nil {
		return err
	}
	ack, err := h.r.js.PublishAsync(subject, b, opts...)
	if err != nil {
		return fmt.Errorf("fanout: relay: publish to %s: %w", subject, err)
	}
	h.inFlight = append(h.inFlight, inFlight{ack: ack})
	h.r.publish.Add(1)
	return nil
}

// reap takes the acknowledged messages off the front of the queue,
// confirming their LSNs, and waits for more until at most keep are left.
func (h *relayHandler) reap(ctx context.Context, keep int) error {
	done := 0
	var confirm uint64
	defer func() {
		h.inFlight = h.inFlight[:copy(h.inFlight, h.inFlight[done:])]
		if confirm != 0 {
			h.r.src.Confirm(confirm)
		}
	}()
	for ; done < len(h.inFlight); done++ {
		f := h.inFlight[done]
		if f.ack != nil {
			wait := len(h.inFlight)-done > keep
			var err error
			if wait {
				select {
				case <-f.ack.Ok():
				case err = <-f.ack.Err():
				case <-ctx.Done():
					return ctx.Err()
				}
			} else {
				select {
				case <-f.ack.Ok():
				case err = <-f.ack.Err():
				default:
					return nil // not yet, and not too many
				}
			}
			if err != nil {
				return fmt.Errorf("fanout: relay: publish to %s: %w", f.ack.Msg().Subject, err)
			}
		}
		if f.lsn != 0 {
			confirm = f.lsn
		}
	}
	return nil
}

// send publishes m on subject and waits for JetStream's acknowledgement.
func (h *relayHandler) send(ctx context.Context, subject string, m *txMsg) error {
	b, err := m.encode()
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, h.r.c.deadline)
	defer cancel()
	if _, err := h.r.js.Publish(sctx, subject, b, jetstream.WithMsgID(m.id())); err != nil {
		return fmt.Errorf("fanout: relay: publish to %s: %w", subject, err)
	}
	h.r.publish.Add(1)
	return nil
}
