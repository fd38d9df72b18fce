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

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/options"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// Follower keeps a Loader (a postgres.Target, such as a
// *guarded.Loader) in step with a table from the relay's JetStream stream
// rather than from the database: it reads the table's subject in stream
// order, applies each committed change once (the creations less the keys
// its own transactions tagged, then the deletions), and passes the
// Loader's lookups through whenever it cannot know what it misses.
//
// It starts from the newest guard saved in the object store with the
// stream sequence it reflects ([WithSnapshots]), reading nothing from the
// table, or, without one, reads the table under a snapshot and skips the
// transactions that snapshot saw. It finds gaps: every transaction names
// the one before it in the table's epoch, so a purged stream, a deleted
// consumer or lost messages end "following" and lead to a read of the
// table, never to a hole. A reset from the relay (its slot made anew, the
// table's publication changed, a TRUNCATE) leads to a read too.
//
// Its heartbeats go through the database as logical decoding messages,
// which the relay passes on to the table's subject: the lag is measured
// from the database through the relay and the stream. Until its first
// marker is back, and whenever its lag passes the max lag, the Loader
// passes every lookup through.
//
// The Follower needs a connection to the database for its heartbeats and
// for a read of the table; it never holds a replication slot.
type Follower[K comparable] struct {
	loader postgres.Target[K]
	js     jetstream.JetStream
	conf   *pgx.ConnConfig
	table  string
	key    string
	parse  func(string) (K, error)
	tags   *postgres.Tagger[K]
	c      config

	// Run's goroutine only.
	feed    *guarded.Feed[K]
	pos     position
	pending string // why the next session reads the table; "" if it may resume

	state       atomic.Int32
	applied     atomic.Int64
	skipped     atomic.Int64
	rtt         atomic.Int64 // nanoseconds
	unconfirmed atomic.Int64 // unix nanoseconds since nothing confirms the guard; 0: all confirmed
	currentAsOf atomic.Int64 // unix nanoseconds: every change committed before it has been applied
	seq         atomic.Uint64
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
	seq   uint64 // the last message applied (or passed by), by stream sequence
	epoch string // of the table's last transaction applied
	lsn   uint64 // its LSN: the next one names it as Prev
	// skip is the snapshot of the last read of the table, until the
	// session's marker is back: the transactions it saw are in the read,
	// and are skipped.
	skip *postgres.Snapshot
}

// NewFollower returns a Follower that keeps loader in step with table's
// keyColumn, parsed with parse from their text form, through the relay's
// stream on nc; dsn is the database's postgres:// URL, for heartbeats and
// reads of the table (no replication needed). Of the options, all but
// WithStreamReplicas and WithMaxAge apply.
func NewFollower[K comparable](loader postgres.Target[K], nc *nats.Conn, dsn, table, keyColumn string, parse func(string) (K, error), opts ...Option) (*Follower[K], error) {
	c := defaults()
	if err := options.Apply("fanout: NewFollower", &c, opts); err != nil {
		return nil, err
	}
	c.deadline = cmp.Or(c.deadline, 3*c.heartbeat)
	c.maxLag = cmp.Or(c.maxLag, 2*c.heartbeat)
	switch {
	case loader == nil || nc == nil || parse == nil || table == "" || keyColumn == "":
		return nil, errors.New("fanout: NewFollower needs a loader, a NATS connection, a table, a key column and a parse function")
	case c.heartbeat <= 0 || c.deadline <= c.heartbeat || c.maxLag <= 0 || c.backoff <= 0:
		return nil, fmt.Errorf("fanout: heartbeat %v, max lag %v and backoff %v must be positive, and the deadline %v longer than the heartbeat", c.heartbeat, c.maxLag, c.backoff, c.deadline)
	case c.logger == nil:
		return nil, errors.New("fanout: WithLogger needs a logger")
	}
	var text func(K) string
	if c.keyText != nil {
		t, ok := c.keyText.(func(K) string)
		if !ok {
			return nil, fmt.Errorf("fanout: WithKeyText needs a func(%T) string", *new(K))
		}
		text = t
	}
	tags, err := postgres.NewTagger(c.origin, parse, text)
	if err != nil {
		return nil, err
	}
	conf, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("fanout: follower: %w", err)
	}
	conf.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	if conf.RuntimeParams["application_name"] == "" {
		conf.RuntimeParams["application_name"] = "cuckooguard fanout follower " + c.origin
	}
	// The key column's forms, for Key and Tag; a type that cannot be
	// followed is refused here (postgres.ErrKeyType).
	if err := tags.UseColumn(conf, table, keyColumn, c.deadline); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("fanout: %w", err)
	}
	c.logger = c.logger.With(slog.Group("cuckooguard", slog.String("table", table)))
	return &Follower[K]{loader: loader, js: js, conf: conf, table: table, key: keyColumn, parse: parse, tags: tags, c: c,
		reads: map[string]int64{}, failures: map[string]int64{}}, nil
}

// Tag names, in transaction tx, the keys it creates on behalf of this
// process's Loader, as postgres.Follower.Tag does: the Follower skips
// exactly those inserts when the relay passes them on.
func (f *Follower[K]) Tag(ctx context.Context, tx pgx.Tx, keys ...K) error {
	return f.tags.Tag(ctx, tx, keys...)
}

// TagQuery returns the statement of Tag for keys, with its arguments, for
// drivers other than pgx.
func (f *Follower[K]) TagQuery(keys ...K) (string, []any, error) { return f.tags.Query(keys...) }

// Key returns the key that the Loader's guard holds for text, a key of
// the followed column in any form the database reads as it, as
// postgres.Follower.Key does: look keys up through it (in the Loader, in
// middleware.Parse), and give the Loader's Insert the keys it returns.
func (f *Follower[K]) Key(text string) (K, error) { return f.tags.Key(text) }

// Stats describes a Follower.
type Stats struct {
	State          postgres.State
	Lag            time.Duration
	CurrentAsOf    time.Time        // every change committed before it has been applied
	Applied        int64            // changes applied
	Skipped        int64            // own inserts, and transactions the last read saw
	Seq            uint64           // the stream sequence of the last message applied
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
	st := Stats{State: postgres.State(f.state.Load()), Lag: f.lagAt(time.Now()), Applied: f.applied.Load(), Skipped: f.skipped.Load(),
		Seq: f.seq.Load(), Reads: map[string]int64{}, Failures: map[string]int64{}, SnapshotStarts: f.restored.Load(),
		SnapshotsSaved: f.saved.Load(), LastError: f.lastErr}
	for k, v := range f.reads {
		st.Reads[k] = v
	}
	for k, v := range f.failures {
		st.Failures[k] = v
	}
	if ns := f.currentAsOf.Load(); ns != 0 {
		st.CurrentAsOf = time.Unix(0, ns)
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

// Why the table is read again, and what ends sessions: the keys of
// Stats.Reads and Stats.Failures.
const (
	readStart    = "start"     // no saved guard to start from
	readReset    = "reset"     // the relay reset the table
	readReread   = "reread"    // a TRUNCATE, or a transaction bigger than the relay holds back
	readGap      = "gap"       // messages are missing from the stream
	readRequest  = "requested" // the Loader asked for a fresh guard
	failDatabase = "database"  // the database connection failed
	failStream   = "stream"    // the stream or its consumer failed
	failSetup    = "setup"     // the table or the stream cannot be found
)

// ReadReasons lists the keys of Stats.Reads: why a Follower read its table
// again. "start" (no saved guard to start from) and "requested" (the
// Loader asked) are routine; "reset" (the relay reset the table), "reread"
// (a TRUNCATE, or a transaction bigger than the relay holds back) and
// "gap" (messages missing from the stream) are worth a look when they
// repeat. Collectors use it to export every reason from the first scrape.
var ReadReasons = []string{readStart, readReset, readReread, readGap, readRequest}

// FailureReasons lists the keys of Stats.Failures: what ended a Follower's
// session: "database" (the database connection failed), "stream" (the stream or
// its consumer failed), "setup" (the table or the stream cannot be found).
var FailureReasons = []string{failDatabase, failStream, failSetup}

// Run follows until ctx ends and returns ctx.Err(), reconnecting with
// backoff after a failed session. The Loader passes every lookup through
// until the first session's marker is back, and after Run returns.
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
	f.unconfirmed.CompareAndSwap(0, time.Now().UnixNano())
	f.pending = readStart
	delay := f.c.backoff
	for {
		followed, err := f.session(ctx)
		feed.Invalidate()
		f.state.Store(int32(postgres.PassThrough))
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
		f.mu.Lock()
		f.failures[failureOf(err)]++
		f.lastErr = err
		f.mu.Unlock()
		if followed > f.c.deadline {
			delay = f.c.backoff
		}
		f.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: fanout follower session failed; lookups pass through until it follows again",
			slog.String("reason", failureOf(err)), slog.Any("error", err), slog.Duration("retry_in", delay))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// reread ends a session that must read the table again, for why.
type reread struct{ why string }

func (r *reread) Error() string { return "fanout: the table must be read again: " + r.why }

// failure tags an error with what ended the session.
type failure struct {
	what string
	err  error
}

func (e *failure) Error() string { return e.err.Error() }
func (e *failure) Unwrap() error { return e.err }

func failureOf(err error) string {
	var f *failure
	if errors.As(err, &f) {
		return f.what
	}
	return failStream
}
