package fanout

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/mono"
	"github.com/cuckooguard/cuckooguard/internal/options"
)

// Follower keeps a Loader (a follow.Target, such as a
// *guarded.Loader) in step with a table from its relay's JetStream stream
// rather than from the database: it reads the table's subject in stream
// order, applies each committed change once (the creations less the keys
// its own transactions tagged, then the deletions), and passes the
// Loader's lookups through whenever it cannot know what it misses.
//
// It starts from the newest guard saved in the object store with the
// place in the stream it reflects ([WithSnapshots]), reading nothing from
// the table, or, without one, reads the table under a snapshot and skips
// the transactions that snapshot saw. Continuity is proven, never assumed:
// it resumes only in the same instance of the stream (one deleted and made
// again is another), only where the stream still holds every message after
// its place, and every transaction and heartbeat names the transaction
// before it in the table's epoch, so a purged or aged-out stream, a
// consumer that skipped messages, a stream of another database or a reset
// from the relay end "following" and lead to a read of the table, never
// to a hole. It ignores what a relay of an older lease term publishes once
// it has seen a newer one.
//
// Its heartbeats go through the database as logical decoding messages,
// which the relay passes on to the table's subject: the lag is measured
// from the database through the relay and the stream, on this process's
// clock, whether messages arrive or not. Until its first marker is back,
// whenever its lag passes the max lag, and at once when its NATS or
// database connection closes, the Loader passes every lookup through.
//
// The Follower needs a connection to the database for its heartbeats and
// for a read of the table; it never holds a replication slot. It is safe
// for concurrent use by multiple goroutines; Run is called once at a time.
type Follower[K comparable] struct {
	loader follow.Target[K]
	js     jetstream.JetStream
	nc     *nats.Conn
	db     follow.Database
	table  string
	key    string
	relay  string // Token of the relay's name
	parse  func(string) (K, error)
	tags   *follow.Tagger[K]
	c      config

	// Run's goroutine only.
	feed    *guarded.Feed[K]
	pos     position
	origin  follow.Origin // of the first session: a later one of another is refused
	pending string        // why the next session reads the table; "" if it may resume
	down    string        // what ended the sessions since it last followed; "" while all is well
	stalled time.Time     // since when the relay is silent while this follower is behind; zero if it is not
	started time.Time     // when Run began
	// followedOnce: a session has followed. Until then a stream that is not
	// there yet is the relay starting, not a fault.
	followedOnce bool
	saidNoStream bool // the first start's wait for the relay's stream was logged

	state       atomic.Int32
	readyTill   mono.Deadline // until when Following holds (fsession.grant)
	applied     atomic.Int64
	skipped     atomic.Int64
	fenced      atomic.Int64 // messages of an older relay term, ignored
	rtt         atomic.Int64 // nanoseconds
	unconfirmed atomic.Int64 // unix nanoseconds since nothing confirms the guard; 0: all confirmed
	currentAsOf atomic.Int64 // unix nanoseconds: every change committed before it has been applied
	seq         atomic.Uint64
	backlog     atomic.Uint64 // messages the consumer had yet to deliver, at the last one
	lastMsg     atomic.Int64  // unix nanoseconds: the last message of the table's subject came then
	saved       atomic.Int64
	restored    atomic.Int64
	mu          sync.Mutex // protects the maps and lastErr
	reads       map[string]int64
	failures    map[string]int64
	lastErr     error
}

// position is where a Follower stands in the stream.
type position struct {
	valid bool
	// unread: the table is to be read at the first message that comes
	// (readAt), rather than now.
	unread bool
	mark
	// skip is the snapshot of the last read of the table, until the
	// session's marker is back: the transactions it saw are in the read,
	// and are skipped.
	skip follow.Seen
}

// NewFollower returns a Follower that keeps loader in step with table's
// keyColumn, parsed with parse from their text form, through the stream
// of the relay named by [WithRelay] (required) on nc; db is the database
// behind the relay (postgres.Relayed), for heartbeats and reads of the
// table (no replication needed). Of the options, all but
// WithStreamReplicas and WithMaxAge apply. A key of several columns is
// named as the relay's follow.Table names it (postgres.Columns("tenant_id",
// "id")): the relay streams each key as its tuple, which parse reads
// (postgres.ParseTuple for Tuple keys).
func NewFollower[K comparable](loader follow.Target[K], nc *nats.Conn, db follow.Database, table, keyColumn string, parse func(string) (K, error), opts ...Option) (*Follower[K], error) {
	c := defaults()
	if err := options.Apply("fanout: NewFollower", &c, opts); err != nil {
		return nil, err
	}
	explicit := c.heartbeat != 0
	c.heartbeat = cmp.Or(c.heartbeat, DefaultHeartbeat)
	c.deadline = cmp.Or(c.deadline, max(3*c.heartbeat, DefaultFollowerDeadline))
	if explicit {
		c.maxLag = cmp.Or(c.maxLag, c.heartbeat*3/2)
	}
	c.maxLag = cmp.Or(c.maxLag, DefaultMaxLag)
	switch {
	case loader == nil || nc == nil || db == nil || parse == nil || table == "" || keyColumn == "":
		return nil, errors.New("fanout: NewFollower needs a loader, a NATS connection, a database, a table, a key column and a parse function")
	case c.relay == "":
		return nil, errors.New("fanout: NewFollower needs the relay's name (WithRelay, the name given to NewRelay)")
	}
	if err := c.check("fanout: NewFollower"); err != nil {
		return nil, err
	}
	var text func(K) string
	if c.keyText != nil {
		t, ok := c.keyText.(func(K) string)
		if !ok {
			return nil, fmt.Errorf("fanout: WithKeyText needs a func(%T) string", *new(K))
		}
		text = t
	}
	tags, err := follow.NewTagger(c.origin, parse, text)
	if err != nil {
		return nil, err
	}
	// The key column's forms, for Key and Tag; a type that cannot be
	// followed is refused here.
	col, err := db.KeyColumn(table, keyColumn, c.deadline)
	if err != nil {
		return nil, err
	}
	if err := tags.UseColumn(col, db.Permanent); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("fanout: %w", err)
	}
	c.logger = c.logger.With(slog.Group("cuckooguard", slog.String("table", table), slog.String("relay", c.relay)))
	return &Follower[K]{loader: loader, js: js, nc: nc, db: db, table: table, key: keyColumn, relay: Token(c.relay), parse: parse,
		tags: tags, c: c, reads: map[string]int64{}, failures: map[string]int64{}}, nil
}

// Tag names, in the transaction that exec runs statements in
// (postgres.ExecIn(tx)), the keys it creates on behalf of this process's
// Loader, as postgres.Follower.Tag does: the Follower skips exactly those
// inserts when the relay passes them on.
func (f *Follower[K]) Tag(ctx context.Context, exec follow.Exec, keys ...K) error {
	switch {
	case ctx == nil:
		return errors.New("fanout: Tag: ctx is nil")
	case exec == nil:
		return errors.New("fanout: Tag: exec is nil")
	}
	q, args, err := f.TagQuery(keys...)
	if err != nil {
		return err
	}
	if err := exec(ctx, q, args...); err != nil {
		return fmt.Errorf("fanout: tag: %w", err)
	}
	return nil
}

// TagQuery returns the statement of Tag for keys, with its arguments, for
// a driver's transaction.
func (f *Follower[K]) TagQuery(keys ...K) (string, []any, error) {
	content, err := f.tags.Content("fanout: Tag", keys...)
	if err != nil {
		return "", nil, err
	}
	q, args := f.db.TagStatement(content)
	return q, args, nil
}

// Key returns the key that the Loader's guard holds for text, a key of
// the followed column in any form the database reads as it, as
// postgres.Follower.Key does: look keys up through it (in the Loader, in
// middleware.Parse), and give the Loader's Insert the keys it returns.
func (f *Follower[K]) Key(text string) (K, error) { return f.tags.Key(text) }

// Stats describes a Follower.
type Stats struct {
	State       follow.State
	Lag         time.Duration
	CurrentAsOf time.Time // every change committed before it has been applied
	Applied     int64     // changes applied
	Skipped     int64     // own inserts, and transactions the last read saw
	Fenced      int64     // messages of a relay whose lease lapsed, ignored
	Seq         uint64    // the stream sequence of the last message applied
	Pending     uint64    // messages of the table the stream held for it beyond the last one delivered
	// RelaySilence is how long no message of the table's subject has come
	// (every follower's heartbeats pass through it, several a second):
	// while it grows past the max lag the relay, or the broker, is stalled,
	// where a Follower that is only behind still gets messages. 0 before
	// the first message.
	RelaySilence time.Duration
	// NATSConnected reports whether the Follower\'s NATS connection is
	// connected (not reconnecting, not closed).
	NATSConnected  bool
	Reads          map[string]int64 // reads of the table, by why
	Failures       map[string]int64 // sessions that ended in an error, by what ended them
	SnapshotStarts int64            // starts from a saved guard
	SnapshotsSaved int64            // guards saved to the object store
	LastError      error
}

// Stats returns the Follower's statistics.
func (f *Follower[K]) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	state := follow.State(f.state.Load())
	if state == follow.Following && !f.readyTill.Holds(now) {
		state = follow.Behind // the lease ran out before the session's goroutine saw it
	}
	st := Stats{State: state, Lag: f.lagAt(now), Applied: f.applied.Load(), Skipped: f.skipped.Load(),
		Fenced: f.fenced.Load(), Seq: f.seq.Load(), Pending: f.backlog.Load(), Reads: map[string]int64{}, Failures: map[string]int64{},
		SnapshotStarts: f.restored.Load(), SnapshotsSaved: f.saved.Load(), LastError: f.lastErr, NATSConnected: f.nc.IsConnected()}
	for k, v := range f.reads {
		st.Reads[k] = v
	}
	for k, v := range f.failures {
		st.Failures[k] = v
	}
	if ns := f.currentAsOf.Load(); ns != 0 {
		st.CurrentAsOf = time.Unix(0, ns)
	}
	if ns := f.lastMsg.Load(); ns != 0 {
		st.RelaySilence = time.Since(time.Unix(0, ns))
	}
	return st
}

// lagAt is the lag at now, as the postgres follower measures it: the round
// trip of the last heartbeat back, or how long nothing has confirmed the
// guard, if longer.
func (f *Follower[K]) lagAt(now time.Time) time.Duration {
	lag := time.Duration(f.rtt.Load())
	if since := f.unconfirmed.Load(); since != 0 {
		lag = max(lag, now.Sub(time.Unix(0, since)))
	}
	return lag
}

// startupGrace is how long a Follower that never followed waits for its
// relay's stream before it calls its absence a fault (in its log).
const startupGrace = 30 * time.Second

// maxFollowerBackoff is the longest a Follower waits between sessions.
const maxFollowerBackoff = 2 * time.Second

// Run follows until ctx ends and returns ctx.Err(), promptly whatever the
// database or the broker does, reconnecting with backoff (up to 2 s) after
// a failed session. The Loader passes every lookup through until the
// first session's marker is back, and after Run returns.
func (f *Follower[K]) Run(ctx context.Context) error {
	if ctx == nil {
		return errors.New("fanout: Follower.Run: ctx is nil")
	}
	feed, err := f.loader.AttachFeed()
	if err != nil {
		return fmt.Errorf("fanout: follower: %w", err)
	}
	f.feed = feed
	defer feed.Detach()
	if rule := f.tags.KeyRule(); rule != nil {
		feed.SetKeyRule(rule) // a caller's key in any text the database reads as it
	}
	f.unconfirmed.CompareAndSwap(0, time.Now().UnixNano())
	f.pending = readStart
	f.started = time.Now()
	delay := f.c.backoff
	for {
		followed, err := f.session(ctx)
		feed.Invalidate()
		f.state.Store(int32(follow.PassThrough))
		f.unconfirmed.CompareAndSwap(0, time.Now().UnixNano())
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var re *reread
		if errors.As(err, &re) {
			f.pending = re.why
			f.pos.valid = false
			continue // at once: the stream works, the table must be read
		}
		reason := failureOf(err)
		f.mu.Lock()
		f.failures[reason]++
		f.lastErr = err
		f.mu.Unlock()
		if followed > f.c.deadline {
			delay = f.c.backoff
		}
		if reason != f.down {
			f.down = reason
			if !f.followedOnce && reason == failSetup && errors.Is(err, jetstream.ErrStreamNotFound) && time.Since(f.started) < startupGrace {
				// A first start beside a relay that has not made its
				// stream yet: no fault, said once.
				f.down = ""
				if !f.saidNoStream {
					f.saidNoStream = true
					f.c.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: fanout follower waits for the relay to make its stream (a first start); lookups pass through until it follows",
						slog.String("stream", f.c.stream))
				}
			} else {
				f.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: fanout follower session failed; lookups pass through until it follows again",
					slog.String("reason", reason), slog.Any("error", err), slog.Duration("retry_in", delay))
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, maxFollowerBackoff)
	}
}
