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

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/internal/options"
)

// SourceTable is a table that a [Source] streams, and its key column, as
// [NewFollower] takes them: Key names the columns of a key of several
// with [Columns], and the Source streams each key as its [Tuple].
type SourceTable struct {
	Table string
	Key   string
}

// A Source streams the committed changes of several published tables
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
type Source struct {
	dial      dialer
	tables    []SourceTable
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

// SourceStart is where a Source's stream starts, for [SourceHandler.Start].
type SourceStart struct {
	Slot string
	LSN  pglogrepl.LSN // the stream carries the transactions that commit after it
	// Reset: the slot was made anew (it did not exist, or lost the WAL it
	// needed), so transactions that committed between the end of what an
	// earlier stream carried and LSN are in no stream: the relay's readers
	// must read the tables again.
	Reset bool
	// Tables are the tables as the server resolved them
	// ("schema.table"), and Versions the version of each one's
	// publication, in the order of NewSource's tables. A publication of
	// another version than the one an earlier stream carried a table's
	// changes under may have kept changes out of that stream (a row
	// filter, an operation left out, the table dropped from it and added
	// again): the relay's readers of that table must read it again.
	Tables, Versions []string
	// Database is the database the stream comes from.
	Database Database
	// Identities are the identities of the tables the stream carries, in
	// the order of NewSource's tables: the oid each name resolved to when
	// the session began, and Versions. A relayed follower's control
	// message that saw another ([SourceControl.Table]) was sent while the
	// name named another table, or its publication was another: the
	// stream is not of the table the application queries.
	Identities []TableIdentity
	// WALEnd is the server's WAL insert position when the session began.
	// A stream that carries a later LSN than it, of this database, comes
	// from a history the database no longer has: it was restored to an
	// earlier point.
	WALEnd pglogrepl.LSN
}

// SourceCommit is one committed transaction, for [SourceHandler.Commit].
type SourceCommit struct {
	LSN      pglogrepl.LSN   // the end of its commit record
	Xid      uint32          // its transaction id (32 bits, as the stream carries it)
	Tables   []SourceChanges // what it did to each table, in the order of NewSource's tables
	Tags     [][]byte        // its tags (Follower.Tag), as written
	Controls []SourceControl // markers and heartbeats of relayed followers
}

// SourceChanges is what a transaction did to one table: its keys in the
// canonical form of the key column's type (the README's "Key types"), as
// [ReadTable] reads them.
type SourceChanges struct {
	Creates, Deletes []string
	Truncated        bool
	// Incomplete: the transaction changed more keys than a Source holds
	// back (2^20 in all), and some of this table's are missing: its
	// readers must read the table again, as after a TRUNCATE.
	Incomplete bool
}

// Touched reports whether the transaction changed the table.
func (c *SourceChanges) Touched() bool {
	return len(c.Creates) > 0 || len(c.Deletes) > 0 || c.Truncated || c.Incomplete
}

// SourceControl is a marker or heartbeat that a relayed follower sent
// through the database: a logical decoding message whose prefix is
// "cuckooguard.hb/" and Route.
type SourceControl struct {
	Route, Payload string
	// Table is the identity of the follower's table as the message's own
	// transaction saw it ([ControlEmitter]); zero if the follower sent
	// none.
	Table TableIdentity
}

// ControlPrefix returns the prefix of the logical decoding messages (the
// markers and heartbeats) that a follower behind a relay sends for route:
// a [Source] passes them on as SourceControl{Route: route}.
func ControlPrefix(route string) string { return controlPrefix + "/" + route }

// A SourceHandler takes what a [Source] streams, from Run's goroutine, in
// commit order.
type SourceHandler interface {
	// Start is called when a session's stream starts, before its first
	// commit.
	Start(ctx context.Context, s SourceStart) error
	// Commit is called for each committed transaction that changed a
	// table or carries control messages. Its slices are reused after it
	// returns.
	Commit(ctx context.Context, c *SourceCommit) error
}

// NewSource returns a Source of tables, whose slot is named after name
// (unique among the relays of the database, the same across their
// restarts). dsn is a postgres:// URL for a user with the REPLICATION
// attribute; run [Publish] for each table first. Of the options,
// [WithHeartbeat], [WithHeartbeatDeadline], [WithBackoff],
// [WithMaxBackoff], [WithLogger], [WithSlotTakeover] and [WithRegistry]
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
// NewSource reads the type of each table's key column through a
// connection of its own, within the heartbeat deadline, and returns an
// error wrapping [ErrKeyType] for a type the guard cannot follow; a
// database that does not answer is no error here (Run returns ErrKeyType
// at its first session).
func NewSource(dsn, name string, tables []SourceTable, opts ...Option) (*Source, error) {
	c := config{backoff: DefaultBackoff, heartbeat: DefaultHeartbeat, logger: discardLogger}
	if err := options.Apply("postgres: NewSource", &c, opts); err != nil {
		return nil, err
	}
	if c.heartbeat > 0 {
		c.deadline = cmp.Or(c.deadline, max(3*c.heartbeat, DefaultHeartbeatDeadline))
	}
	switch {
	case name == "" || len(tables) == 0:
		return nil, errors.New("postgres: NewSource needs a name and at least one table")
	case c.maxBackoff < 0 || c.maxBackoff > MaxBackoff:
		return nil, fmt.Errorf("postgres: NewSource: WithMaxBackoff %v is not in (0, %v]", c.maxBackoff, MaxBackoff)
	case c.backoff <= 0 || c.backoff > cmp.Or(c.maxBackoff, MaxBackoff) || c.heartbeat <= 0 || c.deadline <= c.heartbeat:
		return nil, fmt.Errorf("postgres: NewSource: backoff %v must be in (0, %v], heartbeat %v positive, and the deadline %v longer than the heartbeat",
			c.backoff, MaxBackoff, c.heartbeat, c.deadline)
	case c.logger == nil:
		return nil, errors.New("postgres: WithLogger needs a logger")
	}
	for _, t := range tables {
		if t.Table == "" || t.Key == "" {
			return nil, errors.New("postgres: NewSource: each table needs a name and a key column")
		}
		if _, err := splitColumns(t.Key); err != nil {
			return nil, fmt.Errorf("postgres: NewSource: table %s: %w", t.Table, err)
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
	return &Source{dial: dialer{conf: conf, who: "relay", origin: name, timeout: c.deadline},
		tables: append([]SourceTable(nil), tables...), slot: relaySlotName(name), name: name, registry: config{registry: c.registry},
		takeover: c.takeover, maxBackoff: cmp.Or(c.maxBackoff, MaxBackoff),
		rules:     make([]*keyRule, len(tables)),
		heartbeat: c.heartbeat, deadline: c.deadline, backoff: c.backoff,
		log: c.logger.With(slog.Group("cuckooguard", slog.String("relay", name)))}, nil
}

// ErrSlotOfAnotherDatabase is returned by [Source.Run] when the slot its
// name gives belongs to another database of the cluster: slot names are
// the cluster's, so the relays of two databases of one cluster need
// different names.
var ErrSlotOfAnotherDatabase = errors.New("postgres: the relay's replication slot belongs to another database of the cluster (give the relays of each database their own name)")

// WithSlotTakeover makes a [Source] end the connection that streams its
// slot, if another one does when a session starts, instead of failing and
// trying again: for a caller that holds a lease on the slot (the fanout
// relay), whose previous holder may hang with the slot's walsender open
// (a stopped process, a long pause) after its lease lapsed.
func WithSlotTakeover() Option {
	return func(c *config) { c.takeover = true }
}

// WithMaxBackoff sets the longest wait of a [Source] between failed
// sessions, in (0, [MaxBackoff]] (default MaxBackoff): a relay whose
// sessions fail because its broker is away sets it short, to stream again
// soon after the broker is back.
func WithMaxBackoff(d time.Duration) Option {
	return func(c *config) { c.maxBackoff = d }
}

// SlotName returns the name of the replication slot of the Source named
// name (see NewSource): for tools that list or drop relay slots.
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

// Confirm tells the Source that everything it streamed up to lsn (the
// LSN of a SourceCommit, or of a SourceStart) is durable downstream: the
// slot may move past it. A relay calls it once its readers can read those
// commits for good (the broker acknowledged them); until then the server
// keeps them, and a restarted relay streams them again. Confirm may be
// called from any goroutine.
func (s *Source) Confirm(lsn pglogrepl.LSN) {
	for {
		cur := s.acked.Load()
		if uint64(lsn) <= cur || s.acked.CompareAndSwap(cur, uint64(lsn)) {
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
// the stream's ([SourceControl.Table]): that follower's transaction may be
// older than the session, and the Source's own heartbeat decides. Recheck
// may be called from any goroutine.
func (s *Source) Recheck() { s.recheck.Store(true) }

// SourceStats describes a Source.
type SourceStats struct {
	Streaming bool          // a session streams now
	Sessions  int64         // sessions started
	Failures  int64         // sessions that ended in an error
	Commits   int64         // commits passed to the handler
	Confirmed pglogrepl.LSN // what the handler confirmed
	LastError error         // of the last failed session
	// VisibilityWaits counts the snapshots a Source asked for because a
	// decoded commit was not visible to the last one yet.
	VisibilityWaits int64
	// SlotRetained is the WAL, in bytes, that the slot holds on the
	// server, as of the last heartbeat of a session.
	SlotRetained int64
}

// Stats returns the Source's statistics.
func (s *Source) Stats() SourceStats {
	st := SourceStats{Streaming: State(s.state.Load()) == Following, Sessions: s.sessions.Load(), Failures: s.failures.Load(),
		Commits: s.commits.Load(), Confirmed: pglogrepl.LSN(s.acked.Load()), VisibilityWaits: s.visibilityWaits.Load(), SlotRetained: s.retained.Load()}
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
func (s *Source) Run(ctx context.Context, h SourceHandler) error {
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
