package fanout

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/internal/options"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// Relay holds the one replication slot of a database's guarded tables and
// publishes every committed change of them, in commit order, to a NATS
// JetStream stream, one subject per table, for [Follower]s that follow
// the stream instead of the database. The database then pays for one
// slot and one walsender, whatever the number of replicas and tables.
//
// Any replica can be the relay: every replica runs [Relay.Run], and the
// one that holds a PostgreSQL advisory lock named after the relay
// streams; the others wait to take over. If the relay dies its session
// ends, the lock is free, and another replica takes it within a
// heartbeat and resumes from the slot. The relay confirms a position to
// PostgreSQL only once JetStream acknowledged every message up to it;
// what a relay published before it died and a successor publishes again
// is dropped (each message has an id: the epoch, the LSN and the part),
// or, past JetStream's duplicate window, skipped by the followers by its
// LSN.
//
// It also publishes the tags of the transactions (Follower.Tag) and the
// markers and heartbeats that the followers send through the database, so
// that a follower measures its lag from the database through the relay
// and the stream: a follower behind a dead relay passes its lookups
// through within its max lag.
type Relay struct {
	name    string
	dsn     string
	tables  []postgres.SourceTable
	js      jetstream.JetStream
	nc      *nats.Conn
	c       config
	src     *postgres.Source
	leading atomic.Bool
	publish atomic.Int64 // messages published
	resets  atomic.Int64
	terms   atomic.Int64 // times this process became the relay
}

// NewRelay returns a relay named name (the same for every replica of a
// service: it names the slot and the lock) of tables, published with
// [postgres.Publish], through nc. Of the options, WithStream,
// WithSubjectPrefix, WithMaxAge, WithStreamReplicas, WithHeartbeat,
// WithHeartbeatDeadline, WithBackoff and WithLogger apply.
func NewRelay(dsn, name string, nc *nats.Conn, tables []postgres.SourceTable, opts ...Option) (*Relay, error) {
	c := defaults()
	if err := options.Apply("fanout: NewRelay", &c, opts); err != nil {
		return nil, err
	}
	c.deadline = cmp.Or(c.deadline, 3*c.heartbeat)
	if nc == nil {
		return nil, errors.New("fanout: NewRelay needs a NATS connection")
	}
	src, err := postgres.NewSource(dsn, name, tables, postgres.WithHeartbeat(c.heartbeat),
		postgres.WithHeartbeatDeadline(c.deadline), postgres.WithBackoff(c.backoff), postgres.WithLogger(c.logger))
	if err != nil {
		return nil, err
	}
	// Acks are awaited in order (see relayHandler.reap); one that never
	// comes (a connection lost with the message in it) ends the term
	// within the deadline, and the next resumes from the slot.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*maxInFlight), jetstream.WithPublishAsyncTimeout(c.deadline))
	if err != nil {
		return nil, fmt.Errorf("fanout: %w", err)
	}
	return &Relay{name: name, dsn: dsn, tables: tables, js: js, nc: nc, c: c, src: src}, nil
}

// Leading reports whether this process is the relay now.
func (r *Relay) Leading() bool { return r.leading.Load() }

// RelayStats describes a Relay.
type RelayStats struct {
	Leading   bool
	Terms     int64 // times this process became the relay
	Published int64 // messages published
	Resets    int64 // resets published: the followers of a table read it again
	Source    postgres.SourceStats
}

// Stats returns the relay's statistics.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Leading: r.Leading(), Terms: r.terms.Load(), Published: r.publish.Load(), Resets: r.resets.Load(), Source: r.src.Stats()}
}

// Run campaigns to be the relay until ctx ends, and returns ctx.Err():
// every heartbeat it tries to take the relay's advisory lock; holding it,
// it streams the tables and publishes their changes until it loses the
// lock's connection or the stream fails for good. It returns an error at
// once for a setup that cannot work (postgres.ErrLogicalUnavailable,
// postgres.ErrNotPublished, postgres.ErrKeyType).
func (r *Relay) Run(ctx context.Context) error {
	if ctx == nil {
		return errors.New("fanout: Relay.Run: ctx is nil")
	}
	for {
		err := r.term(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, postgres.ErrLogicalUnavailable) || errors.Is(err, postgres.ErrNotPublished) || errors.Is(err, postgres.ErrKeyNotIdentity) || errors.Is(err, postgres.ErrKeyType) {
			return err
		}
		if err != nil {
			r.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: relay term ended", slog.Any("error", err))
		}
		t := time.NewTimer(r.c.heartbeat/2 + rand.N(r.c.heartbeat/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// term tries to take the lock and, holding it, relays until it loses it.
func (r *Relay) term(ctx context.Context) error {
	conf, err := pgx.ParseConfig(r.dsn)
	if err != nil {
		return fmt.Errorf("fanout: relay: %w", err)
	}
	conf.RuntimeParams["application_name"] = "cuckooguard relay lock " + r.name
	cctx, cancel := context.WithTimeout(ctx, r.c.deadline)
	lock, err := pgx.ConnectConfig(cctx, conf)
	cancel()
	if err != nil {
		return fmt.Errorf("fanout: relay: connect: %w", err)
	}
	defer lock.Close(context.WithoutCancel(ctx))
	var got bool
	if err := lock.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, "cuckooguard relay "+r.name).Scan(&got); err != nil || !got {
		return err
	}
	r.terms.Add(1)
	r.leading.Store(true)
	defer r.leading.Store(false)
	r.c.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: this process is the relay")
	tctx, end := context.WithCancelCause(ctx)
	defer end(nil)
	go func() { // the lock holds while its connection lives
		t := time.NewTicker(r.c.heartbeat)
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-t.C:
				pctx, cancel := context.WithTimeout(tctx, r.c.deadline)
				_, err := lock.Exec(pctx, "SELECT 1")
				cancel()
				if err != nil && tctx.Err() == nil {
					end(fmt.Errorf("fanout: relay: lost the lock's connection: %w", err))
					return
				}
			}
		}
	}()
	if err := r.ensureStream(tctx); err != nil {
		return err
	}
	h := &relayHandler{r: r, ctx: tctx}
	err = r.src.Run(tctx, h)
	if cause := context.Cause(tctx); cause != nil && ctx.Err() == nil {
		return cause
	}
	return err
}

// ensureStream makes the stream if it does not exist.
func (r *Relay) ensureStream(ctx context.Context) error {
	_, err := r.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: r.c.stream, Subjects: []string{r.c.prefix + ".>"}, Storage: r.c.storage, Replicas: r.c.replicas,
		MaxAge: r.c.maxAge, Duplicates: r.c.duplicates, Discard: jetstream.DiscardOld,
	})
	if err != nil {
		return fmt.Errorf("fanout: relay: make stream %s: %w", r.c.stream, err)
	}
	return nil
}

// maxInFlight is how many messages the relay publishes ahead of
// JetStream's acknowledgements.
const maxInFlight = 1024

// relayHandler publishes what the relay's Source streams.
type relayHandler struct {
	r      *Relay
	ctx    context.Context
	tables []relayTable
	routes map[string]int // subject token: table

	// The messages published and not acknowledged yet, oldest first: the
	// relay publishes ahead of the acknowledgements, a round trip to the
	// stream per transaction being what would bound its throughput, and
	// confirms a transaction's LSN once every message up to its own is
	// acknowledged. One that fails ends the term: a message after it may
	// be in the stream while it is not, and the followers find that gap
	// by the Prev chain and read the table.
	inFlight []inFlight
}

// inFlight is a message published and not acknowledged yet: once it and
// every message before it are, lsn (if not 0) may be confirmed.
type inFlight struct {
	ack jetstream.PubAckFuture // nil: nothing to wait for
	lsn pglogrepl.LSN
}

// relayTable is where a table's messages stand in the stream.
type relayTable struct {
	subject string // <prefix>.<token>
	epoch   string
	last    uint64 // the LSN of its last transaction in the stream
	version string
}

// Start reads where each table's messages stand in the stream, and
// publishes a reset for a table whose stream cannot continue: the slot was
// made anew, the stream holds nothing of it, or its publication changed.
func (h *relayHandler) Start(ctx context.Context, st postgres.SourceStart) error {
	s, err := h.r.js.Stream(ctx, h.r.c.stream)
	if err != nil {
		return fmt.Errorf("fanout: relay: %w", err)
	}
	h.inFlight = nil // a session's: what the last one left unacknowledged it publishes again
	h.tables = make([]relayTable, len(st.Tables))
	h.routes = make(map[string]int, len(st.Tables))
	for i, name := range st.Tables {
		tok := Token(name)
		t := relayTable{subject: h.r.c.prefix + "." + tok, version: st.Versions[i]}
		h.routes[tok] = i
		last, err := s.GetLastMsgForSubject(ctx, t.subject+".tx")
		var m txMsg
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return fmt.Errorf("fanout: relay: read the last message of %s: %w", t.subject, err)
		default:
			if m, err = decodeTx(last.Data); err != nil {
				return err
			}
		}
		if st.Reset || m.Epoch == "" || m.Version != st.Versions[i] {
			t.epoch = fmt.Sprintf("%s/%x", st.LSN, rand.Uint64())
			t.last = uint64(st.LSN)
			reset := txMsg{Epoch: t.epoch, LSN: t.last, Reset: true, Reread: true, Version: t.version}
			if err := h.send(ctx, t.subject+".tx", &reset); err != nil {
				return err
			}
			h.r.resets.Add(1)
			h.r.c.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: relay reset a table: its followers read it again",
				slog.String("table", name), slog.Bool("new_slot", st.Reset), slog.Bool("version_changed", m.Epoch != "" && m.Version != st.Versions[i]))
		} else {
			t.epoch, t.last = m.Epoch, m.LSN
		}
		h.tables[i] = t
	}
	h.r.src.Confirm(st.LSN)
	return nil
}

// Commit publishes one committed transaction: each table's part of it
// that the stream does not hold yet, then the followers' control
// messages, and confirms it once JetStream acknowledged them all and
// every message before them. It waits for the acknowledgements only to
// keep fewer than maxInFlight messages out, and at each control message
// (a heartbeat or a marker: at least once a heartbeat), so that the slot
// is confirmed as often.
func (h *relayHandler) Commit(ctx context.Context, c *postgres.SourceCommit) error {
	limit := int(h.r.nc.MaxPayload()) / 2
	for i := range c.Tables {
		ch, t := &c.Tables[i], &h.tables[i]
		if !ch.Touched() || uint64(c.LSN) <= t.last {
			continue // nothing, or published before this session
		}
		m := txMsg{Epoch: t.epoch, LSN: uint64(c.LSN), Prev: t.last, Xid: c.Xid, Creates: ch.Creates, Deletes: ch.Deletes,
			Tags: c.Tags, Reread: ch.Truncated || ch.Incomplete, Version: t.version}
		for _, p := range split(m, limit) {
			b, err := p.encode()
			if err != nil {
				return err
			}
			id := fmt.Sprintf("%s:%d:%d", p.Epoch, p.LSN, p.Part)
			if err := h.publish(ctx, t.subject+".tx", b, jetstream.WithMsgID(id)); err != nil {
				return err
			}
		}
		t.last = uint64(c.LSN)
	}
	controls := false
	for _, ctl := range c.Controls {
		i, ok := h.routes[ctl.Route]
		if !ok {
			continue // a follower of a table this relay does not stream
		}
		if err := h.publish(ctx, h.tables[i].subject+".ctl", []byte(ctl.Payload)); err != nil {
			return err
		}
		controls = true
	}
	h.inFlight = append(h.inFlight, inFlight{lsn: c.LSN})
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
	var confirm pglogrepl.LSN
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
	id := fmt.Sprintf("%s:%d:%d", m.Epoch, m.LSN, m.Part)
	if _, err := h.r.js.Publish(ctx, subject, b, jetstream.WithMsgID(id)); err != nil {
		return fmt.Errorf("fanout: relay: publish to %s: %w", subject, err)
	}
	h.r.publish.Add(1)
	return nil
}
