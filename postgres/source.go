package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/internal/options"
)

var _ follow.Source = (*source)(nil)

// A source streams the committed changes of several published tables
// through one replication slot, for a relay that passes them on (the
// fanout module publishes them to NATS JetStream, for replicas that
// follow the stream instead of the database). Whatever the number of
// tables and of replicas behind the relay, the server decodes its WAL
// once, for one slot and one walsender. It also passes on, in commit
// order, the tags of the transactions ([Follower.Tag]) and the markers
// and heartbeats that relayed followers send through the database, so
// that a replica measures its lag from the database through the relay.
//
// A Source keeps no guard: it is a pipe. Its slot is permanent, named
// after the Source's name, and keeps the changes since the position the
// relay last confirmed ([Source.Confirm]): a relay that confirms only what
// its readers can read durably loses nothing across a lost connection or a
// restart, even on another process.
type source struct {
	dial      dialer
	tables    []follow.Table
	slot      string
	name      string
	registry  config    // its registry (WithRegistry) only
	noted     time.Time // when the slot's use was last noted in cuckooguard_slots; the heartbeat's goroutine only
	noteSaid  bool      // a failure to note it was logged
	heartbeat time.Duration
	deadline  time.Duration
	backoff   time.Duration
	log       *slog.Logger

	acked      atomic.Uint64 // what the handler confirmed
	lastStream uint32        // the walsender of the last session; Run's goroutine only
	// remake: the last session's walsender could not find a publication
	// that exists now (see remakeSlot); Run's goroutine only.
	remake     bool
	rules      []*keyRule   // the tables' key forms, as the last session read them; Run's goroutine only
	state      atomic.Int32 // Following while a session streams, else PassThrough
	sessions   atomic.Int64
	failures   atomic.Int64
	commits    atomic.Int64
	lastErr    atomic.Pointer[error]
	takeover   bool
	maxBackoff time.Duration
	// visibilityWaits counts the snapshots that did not see a decoded
	// commit yet (see visibility).
	visibilityWaits atomic.Int64
	retained        atomic.Int64 // bytes of WAL the slot holds, at the last heartbeat
	recheck         atomic.Bool  // send a heartbeat now (Recheck)
}

// controlPrefixOf returns the prefix of the logical decoding messages (the
// markers and heartbeats) that a follower behind a relay sends for route:
// a relay's source passes them on as follow.Control{Route: route}.
func controlPrefixOf(route string) string { return controlPrefix + "/" + route }

// newSource returns a Source of tables, whose slot is named after name
// (unique among the relays of the database, the same across their
// restarts). dsn is a postgres:// URL for a user with the REPLICATION
// attribute; run [Publish] for each table first. Of the options,
// [WithHeartbeat], [WithHeartbeatDeadline], [WithBackoff],
// [WithMaxBackoff], [WithLogger], [withSlotTakeover] and [WithRegistry]
// apply. Its slot's use is noted in cuckooguard_slots beside each of its
// tables (or in WithRegistry's), so that [Slots], [DropStaleSlots] and
// [Unpublish] of a table see it.
//
// The handler gets a commit that changed a table only once it is visible
// to new snapshots: a commit is decoded as soon as its record is flushed,
// but a backend that waits for a synchronous standby keeps it invisible
// until the standby answers, and the Source holds it, and everything after
// it, back until then. A reader that learns of a commit from the handler's
// output and then takes a snapshot sees the commit's rows.
//
// newSource reads the type of each table's key column through a
// connection of its own, within the heartbeat deadline, and returns an
// error wrapping [ErrKeyType] for a type the guard cannot follow; a
// database that does not answer is no error here (Run returns ErrKeyType
// at its first session).
func newSource(dsn, name string, tables []follow.Table, opts ...Option) (*source, error) {
	c := config{backoff: DefaultBackoff, heartbeat: DefaultHeartbeat, logger: discardLogger}
	if err := options.Apply("postgres: newSource", &c, opts); err != nil {
		return nil, err
	}
	if c.heartbeat > 0 {
		c.deadline = cmp.Or(c.deadline, max(3*c.heartbeat, DefaultHeartbeatDeadline))
	}
	switch {
	case name == "" || len(tables) == 0:
		return nil, errors.New("postgres: newSource needs a name and at least one table")
	case c.maxBackoff < 0 || c.maxBackoff > MaxBackoff:
		return nil, fmt.Errorf("postgres: newSource: WithMaxBackoff %v is not in (0, %v]", c.maxBackoff, MaxBackoff)
	case c.backoff <= 0 || c.backoff > cmp.Or(c.maxBackoff, MaxBackoff) || c.heartbeat <= 0 || c.deadline <= c.heartbeat:
		return nil, fmt.Errorf("postgres: newSource: backoff %v must be in (0, %v], heartbeat %v positive, and the deadline %v longer than the heartbeat",
			c.backoff, MaxBackoff, c.heartbeat, c.deadline)
	case c.logger == nil:
		return nil, errors.New("postgres: WithLogger needs a logger")
	}
	for _, t := range tables {
		if t.Table == "" || t.Key == "" {
			return nil, errors.New("postgres: newSource: each table needs a name and a key column")
		}
		if _, err := splitColumns(t.Key); err != nil {
			return nil, fmt.Errorf("postgres: newSource: table %s: %w", t.Table, err)
		}
	}
	conf, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: source: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
	defer cancel()
	// Refuse a key type that cannot be followed now, if the database can
	// be reached; if not, Run refuses it once it connects.
	if conn, err := keyTypeConn(ctx, conf); err == nil {
		defer conn.Close(context.WithoutCancel(ctx))
		for _, t := range tables {
			r, err := resolve(ctx, conn, t.Table)
			if err != nil {
				continue
			}
			if err := checkKeyType(ctx, conn, r, t.Key); errors.Is(err, ErrKeyType) {
				return nil, err
			}
		}
	}
	return &source{dial: dialer{conf: conf, who: "relay", origin: name, timeout: c.deadline},
		tables: append([]follow.Table(nil), tables...), slot: relaySlotName(name), name: name, registry: config{registry: c.registry},
		takeover: c.takeover, maxBackoff: cmp.Or(c.maxBackoff, MaxBackoff),
		rules:     make([]*keyRule, len(tables)),
		heartbeat: c.heartbeat, deadline: c.deadline, backoff: c.backoff,
		log: c.logger.With(slog.Group("cuckooguard", slog.String("relay", name)))}, nil
}

// ErrSlotOfAnotherDatabase is returned by a relay's Run when the slot its
// name gives belongs to another database of the cluster: slot names are
// the cluster's, so the relays of two databases of one cluster need
// different names.
var ErrSlotOfAnotherDatabase = errors.New("postgres: the relay's replication slot belongs to another database of the cluster (give the relays of each database their own name)")

// withSlotTakeover makes a relay's source end the connection that streams its
// slot, if another one does when a session starts, instead of failing and
// trying again: for a caller that holds a lease on the slot (the fanout
// relay), whose previous holder may hang with the slot's walsender open
// (a stopped process, a long pause) after its lease lapsed.
func withSlotTakeover() Option {
	return func(c *config) { c.takeover = true }
}

// WithMaxBackoff sets the longest wait of a relay's source between failed
// sessions, in (0, [MaxBackoff]] (default MaxBackoff): a relay whose
// sessions fail because its broker is away sets it short, to stream again
// soon after the broker is back.
func WithMaxBackoff(d time.Duration) Option {
	return func(c *config) { c.maxBackoff = d }
}

// SlotName returns the name of the replication slot of the Source named
// name (see newSource): for tools that list or drop relay slots.
func SlotName(name string) string { return relaySlotName(name) }

// relaySlotName returns the name of the slot of the Source named name:
// "cg_relay_" and the name in lower case, "_" for anything but letters,
// digits and "_", shortened with a hash to PostgreSQL's 63 bytes.
func relaySlotName(name string) string {
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '_'
	}, name)
	s := "cg_relay_" + clean
	if len(s) > 63 {
		s = fmt.Sprintf("%s_%08x", s[:63-9], fnv32(name))
	}
	return s
}

// Confirm tells the Source that everything it streamed up to pos (the
// Pos of a follow.Commit, or of a follow.Start) is durable downstream: the
// slot may move past it. A relay calls it once its readers can read those
// commits for good (the broker acknowledged them); until then the server
// keeps them, and a restarted relay streams them again. Confirm may be
// called from any goroutine.
func (s *source) Confirm(pos uint64) {
	for {
		cur := s.acked.Load()
		if pos <= cur || s.acked.CompareAndSwap(cur, pos) {
			return
		}
	}
}

// Recheck makes the Source's session send its own heartbeat at once,
// rather than at the next heartbeat: a heartbeat reads, in a transaction of
// its own, what each table's name resolves to and the version of its
// publication, and ends the session if either changed since the session
// began (the next session streams the table the name now names). A relay
// calls it when a follower's control message saw another identity than
// the stream's ([follow.Control.Table]): that follower's transaction may be
// older than the session, and the Source's own heartbeat decides. Recheck
// may be called from any goroutine.
func (s *source) Recheck() { s.recheck.Store(true) }

// Stats returns the Source's statistics.
func (s *source) Stats() follow.SourceStats {
	st := follow.SourceStats{Streaming: State(s.state.Load()) == Following, Sessions: s.sessions.Load(), Failures: s.failures.Load(),
		Commits: s.commits.Load(), Confirmed: s.acked.Load(), VisibilityWaits: s.visibilityWaits.Load(), Retained: s.retained.Load()}
	if e := s.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// Run streams until ctx ends, reconnecting with backoff after failures,
// and returns ctx.Err(). It returns at once an error that wraps
// [ErrLogicalUnavailable], [ErrNotPublished], [ErrKeyNotIdentity] or
// [ErrSlotOfAnotherDatabase] if its first session finds a setup that
// cannot work. A failed session is logged ([WithLogger])
// when its reason differs from the last one's.
func (s *source) Run(ctx context.Context, h follow.Handler) error {
	if ctx == nil || h == nil {
		return errors.New("postgres: Source.Run needs a context and a handler")
	}
	b := newBackoff(s.backoff, s.maxBackoff)
	var logged Reason
	for first := true; ; first = false {
		streamed, err := s.session(ctx, h)
		s.state.Store(int32(PassThrough))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if streamed > s.deadline {
			b.reset()
			logged = ""
		}
		s.failures.Add(1)
		s.lastErr.Store(&err)
		if first && (errors.Is(err, ErrLogicalUnavailable) || errors.Is(err, ErrNotPublished) || errors.Is(err, ErrKeyNotIdentity) || errors.Is(err, ErrSlotOfAnotherDatabase) || errors.Is(err, ErrKeyType)) {
			return err
		}
		d := b.next()
		if r := reasonOf(err); r != logged {
			logged = r
			s.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: relay's stream failed; it reconnects",
				slog.String("reason", string(r)), slog.Any("error", err), slog.Duration("retry_in", d))
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// newSourceToken returns the token of a Source session's heartbeats.
func newSourceToken() string {
	return fmt.Sprintf("source.%x", rand.Uint64())
}
