package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/mono"
	"github.com/cuckooguard/cuckooguard/internal/options"
)

// State is what a Follower is doing: [follow.State], which every
// follower of every database reports.
type State = follow.State

// The states of a Follower.
const (
	PassThrough = follow.PassThrough // not connected: the Loader passes every lookup through
	Resyncing   = follow.Resyncing   // reading the table, or catching up from a saved position; lookups pass through
	Following   = follow.Following   // applying changes as they arrive, as a heartbeat sent less than the max lag ago proved
	Behind      = follow.Behind      // applying changes more than the max lag late; lookups pass through
)

// A follower is Following only while the last heartbeat back was sent
// less than the max lag ago: the Loader's readiness is a lease to that
// moment ([guarded.Feed.ReadyUntil]), and Stats judges the state by the
// same lease when it is called, so that a process that wakes from a pause
// reports Behind before its follower's goroutine has run.

// Target is what a [Follower] keeps in step with a table: a
// *guarded.Loader[K, V] of any value type V ([follow.Target]).
type Target[K comparable] = follow.Target[K]

// Follower keeps a [Target] (a *guarded.Loader) in step with the writes
// every process makes to a table, from PostgreSQL's own change stream:
// logical decoding of a publication of the table's key column ([Publish]),
// or, with [WithNotify], the notifications of the trigger of [Install].
//
// [Follower.Run] attaches itself to the Loader as its change feed
// ([guarded.Loader.AttachFeed]), reads every key into a fresh guard under
// a snapshot that meets the change stream exactly (the one the replication
// slot exports as it is created), and then applies each change after it,
// in commit order: every delete, key update and TRUNCATE, this process's
// own included, and the inserts of other processes. It skips only the
// inserts of transactions this process tagged ([Follower.Tag]), whose keys
// its Loader added before writing them; the Loader's own deletes remove
// nothing themselves, so that each removal follows the creation it undoes
// (FOLLOWER.md gives the whole argument). If the connection drops, the
// Loader is invalidated (every lookup passes through) and Run reconnects
// with backoff, resuming from the last change it applied: the replication
// slot, named after the table and the origin ([WithOrigin]), keeps the
// changes since. A restarted process starts from the guard it saved
// ([WithSnapshotFile]). It reads the whole table again only when it must,
// and says why (FollowerStats.FullReads). No false negative at any point;
// other processes' writes become visible after the stream's delay (the
// staleness, measured in the package tests).
//
// A Follower is safe for concurrent use: Run in one goroutine, Stats and
// Tag from any. A Loader follows one Follower at a time.
type Follower[K comparable] struct {
	loader    Target[K]
	dial      dialer
	table     string
	key       string
	parse     func(string) (K, error)
	origin    string
	backoff   time.Duration
	maxLag    time.Duration
	heartbeat time.Duration
	deadline  time.Duration
	notify    bool
	snapPath  string
	snapEvery time.Duration
	log       *slog.Logger

	tags *tagger[K] // this run's tags, and the key column's forms (Key)

	// Touched by Run's goroutine only.
	feed         *guarded.Feed[K]
	rule         *keyRule         // the key column's forms, as the session read them
	pos          position         // logical decoding: what the guard reflects
	pending      ReadReason       // why the next session must read the whole table; "" if it may resume (see decide)
	held         []heldDeletes[K] // deletions applied to the position but not yet to the guard: their transactions are not known visible (apply.go)
	heldKeys     map[K]int        // of held's deletions, how many of each key are still to be applied
	cancelled    map[K]int        // of held's deletions, how many of each key a later creation cancelled (apply.go's create)
	degradedSaid bool             // the refusal to save a degraded guard was logged
	lastStream   uint32           // the walsender of the last session's stream
	noteSaid     bool             // a failure to note the slot in cuckooguard_slots was logged
	registry     config           // where cuckooguard_slots is (WithRegistry)

	state          atomic.Int32
	readyTill      mono.Deadline // until when Following holds (grant)
	rtt            atomic.Int64  // nanoseconds: the round trip of the last heartbeat (or marker) back
	unconfirmed    atomic.Int64  // unix nanoseconds since which nothing confirms the guard is current; 0: all confirmed
	retryDelay     atomic.Int64  // nanoseconds: the wait before the last reconnect
	applied        atomic.Int64
	skipped        atomic.Int64
	resyncs        atomic.Int64
	failures       atomic.Int64
	beats          atomic.Int64
	beatsLost      atomic.Int64 // sessions ended because heartbeats stopped coming back
	pid            atomic.Uint32
	lastApplied    atomic.Int64  // unix nanoseconds
	lastBeat       atomic.Int64  // unix nanoseconds of the last heartbeat that came back
	currentAsOf    atomic.Int64  // unix nanoseconds: every change committed before it has been applied (when the last heartbeat back was sent)
	decodingBehind atomic.Int64  // bytes of WAL the walsender had yet to decode, while the stream waits for it; 0 otherwise
	behindSince    atomic.Int64  // unix nanoseconds since the stream waits for a busy walsender; 0: it does not
	busyWaits      atomic.Int64  // times the stream waited for a busy walsender instead of reconnecting
	appliedLSN     atomic.Uint64 // pos.applied, published
	streamID       string        // the database's identity (Database.Token): the stream of the positions reported to the feed; Run's goroutine only
	flushedLSN     atomic.Uint64 // the position last confirmed to the server
	retained       atomic.Int64  // bytes of WAL the slot holds, as last read
	snapshots      atomic.Int64  // snapshot files written
	restores       atomic.Int64  // sessions started from a snapshot file
	lastSnap       atomic.Int64  // unix nanoseconds of the last snapshot file written
	mu             sync.Mutex    // protects lastErr, byReason and reads
	lastErr        error
	byReason       map[Reason]int64
	reads          map[ReadReason]int64
}

// NewFollower returns a Follower that applies the changes of table's
// keyColumn (or columns), parsed with parse from their text form, to
// loader. dsn is a postgres:// URL; the Follower opens two connections of
// its own. By default it follows through logical decoding: run [Publish]
// first (every replica may), and give each process its origin
// ([WithOrigin]).
//
// parse gets each key in the canonical form of the column's type
// ([Follower.Key]; the README's "Key types"). For a key of several columns
// (keyColumn made by [Columns]) it gets the key's [Tuple], each column's
// text in its type's canonical form: K is a Tuple (parse is [ParseTuple])
// or a type of the caller's that reads one. NewFollower reads the type
// through a connection of its own, within the heartbeat deadline, and
// returns an error wrapping [ErrKeyType] for a type the guard cannot
// follow; a database that does not answer is no error here (Run reads
// the type again, and returns ErrKeyType at its first session).
func NewFollower[K comparable](loader Target[K], dsn, table, keyColumn string, parse func(string) (K, error), opts ...Option) (*Follower[K], error) {
	c := config{backoff: DefaultBackoff, heartbeat: DefaultHeartbeat, logger: discardLogger, snapshotInterval: DefaultSnapshotInterval}
	if err := options.Apply("postgres: NewFollower", &c, opts); err != nil {
		return nil, err
	}
	if c.heartbeat > 0 {
		c.deadline = cmp.Or(c.deadline, max(3*c.heartbeat, DefaultHeartbeatDeadline))
		c.maxLag = cmp.Or(c.maxLag, c.heartbeat*3/2)
	}
	switch {
	case loader == nil || parse == nil || table == "" || keyColumn == "":
		return nil, errors.New("postgres: NewFollower needs a loader, a table, a key column and a parse function")
	case c.backoff <= 0 || c.backoff > MaxBackoff || c.maxLag <= 0 || c.heartbeat <= 0 || c.deadline <= c.heartbeat:
		return nil, fmt.Errorf("postgres: backoff %v must be in (0, %v], max lag %v and heartbeat %v positive, and the heartbeat deadline %v longer than the heartbeat",
			c.backoff, MaxBackoff, c.maxLag, c.heartbeat, c.deadline)
	case c.logger == nil:
		return nil, errors.New("postgres: WithLogger needs a logger")
	case c.snapshotPath != "" && c.notify:
		return nil, errors.New("postgres: WithSnapshotFile needs logical decoding, not WithNotify: a NOTIFY follower has no position to resume from")
	case c.snapshotPath != "" && c.origin == "":
		return nil, errors.New("postgres: WithSnapshotFile needs WithOrigin: the replication slot must outlive the process")
	case c.snapshotInterval <= 0:
		return nil, fmt.Errorf("postgres: snapshot interval %v must be positive", c.snapshotInterval)
	}
	if _, err := splitColumns(keyColumn); err != nil {
		return nil, err
	}
	conf, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: follower: %w", err)
	}
	f := &Follower[K]{loader: loader, dial: dialer{conf: conf, who: "follower", origin: c.origin, timeout: c.deadline}, table: table, key: keyColumn, parse: parse,
		origin: c.origin, backoff: c.backoff, maxLag: c.maxLag, heartbeat: c.heartbeat, deadline: c.deadline,
		notify: c.notify, snapPath: c.snapshotPath, snapEvery: c.snapshotInterval,
		// Its own attributes under a group of their own: a user's logger
		// that says "table" itself does not print two.
		log:      c.logger.With(slog.Group("cuckooguard", slog.String("table", table))),
		byReason: make(map[Reason]int64), reads: make(map[ReadReason]int64), registry: config{registry: c.registry}}
	text, err := keyTextFor[K](c.keyText)
	if err != nil {
		return nil, err
	}
	if f.tags, err = newTagger(c.origin, parse, text); err != nil {
		return nil, err
	}
	f.tags.notify = c.notify
	if err := f.tags.UseColumn(conf, table, keyColumn, c.deadline); err != nil {
		return nil, err
	}
	return f, nil
}

// Key returns the key that the Loader's guard holds for text, a key of
// the followed column in any form the database reads as it: parse of the
// text's canonical form for the column's type. Look keys up through it,
// in the Loader and in middleware.Parse, and give the Loader's Insert the
// keys it returns: two texts the database takes for one key ("ab" and the
// "ab   " of a character(5), "Alice@Example.com" and "alice@example.com"
// of a citext, 1.50 and 1.5) are one key to it, and a lookup in another
// form could read absent although the database finds the row. Key returns
// an error for a text whose key it cannot tell (see [Tagger.Key]): pass
// that lookup on to the store. It is safe for concurrent use.
//
// NewFollower reads the column's type; if the database did not answer
// then, Key reads it at its first call, and returns an error wrapping
// [ErrKeyUnknown] until it can.
func (f *Follower[K]) Key(text string) (K, error) {
	return f.tags.Key(text)
}

// Run follows the table until ctx ends, reconnecting after failures, and
// returns ctx.Err(). Until its first session has read the table (or
// started from a saved guard) and caught up, the Loader passes every
// lookup through, and when Run returns the Loader is invalid again (it
// cannot know what it misses without the feed). Run returns an error at
// once if the Loader has another change feed, such as a Follower whose Run
// has not returned, and after its first session if that session finds a
// setup that cannot work: [ErrLogicalUnavailable] or [ErrNotPublished]
// (logical decoding), [ErrNotInstalled] or [ErrNoNotifications]
// ([WithNotify]).
//
// After a failed session Run waits before it reconnects: the first delay
// ([WithBackoff]), doubled after each session that failed again, up to
// [MaxBackoff], each wait drawn from the upper half of the delay. A
// session that followed for longer than the heartbeat deadline starts the
// delays over. Each session's failure is counted by [Reason] and logged
// ([WithLogger]) when its reason differs from the last one's. With a
// snapshot file, Run saves the guard before it returns.
//
// The Follower's connections show in pg_stat_activity with the
// application_name "cuckooguard follower stream" (or "listen") and
// "cuckooguard follower read", followed by the origin, unless the DSN
// sets one.
func (f *Follower[K]) Run(ctx context.Context) error {
	if ctx == nil {
		return errors.New("postgres: Follower.Run: ctx is nil")
	}
	feed, err := f.loader.AttachFeed()
	if err != nil {
		return fmt.Errorf("postgres: follower: %w", err)
	}
	f.feed = feed
	defer feed.Detach()
	if rule := f.tags.KeyRule(); rule != nil {
		feed.SetKeyRule(rule) // a caller's key in any text the database reads as it
	}
	f.unconfirmed.CompareAndSwap(0, time.Now().UnixNano()) // nothing confirmed yet
	f.pending = ReadStart
	defer f.saveOnExit()
	b := newBackoff(f.backoff, MaxBackoff)
	var logged Reason // the reason last logged; "" after a healthy session
	for first := true; ; first = false {
		followed, err := f.session(ctx)
		feed.Invalidate()
		f.state.Store(int32(PassThrough))
		f.pid.Store(0)
		// From now on nothing confirms the guard: the lag grows.
		f.unconfirmed.CompareAndSwap(0, time.Now().UnixNano())
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if followed > f.deadline || errors.Is(err, errResync) || errors.Is(err, errTruncated) || errors.Is(err, errBigTransaction) {
			// A healthy session: the next fault is met with the first
			// delay, not with the one the last fault left.
			b.reset()
			logged = ""
		}
		switch {
		case errors.Is(err, errResync):
			f.require(ReadRequested)
			continue
		case errors.Is(err, errTruncated):
			f.require(ReadTruncated)
			continue
		case errors.Is(err, errBigTransaction):
			f.require(ReadBigTransaction)
			continue
		case errors.Is(err, errTableChanged):
			// Passes through now; the next session resolves the name
			// again and reads the table it names, once it is published.
			f.require(ReadTableChanged)
		case errors.Is(err, errPublicationChanged):
			// Passes through now; the next session reads the table, once
			// the publication sends what the follower needs again.
			f.require(ReadPublication)
		case f.notify || f.origin == "":
			f.require(ReadNoResume) // the stream cannot be resumed
		}
		reason := reasonOf(err)
		f.failures.Add(1)
		f.mu.Lock()
		f.lastErr = err
		f.byReason[reason]++
		f.mu.Unlock()
		if first && (errors.Is(err, ErrNoNotifications) || errors.Is(err, ErrNotInstalled) ||
			errors.Is(err, ErrLogicalUnavailable) || errors.Is(err, ErrNotPublished) || errors.Is(err, ErrKeyType)) {
			// A setup that cannot work will not start to: say so rather
			// than leave the Loader passing through for good. Later
			// sessions retry: a trigger or publication dropped while
			// running may come back.
			f.log.LogAttrs(ctx, slog.LevelError, "cuckooguard: follower cannot follow",
				slog.String("reason", string(reason)), slog.Any("error", err))
			return err
		}
		var d time.Duration
		if errors.Is(err, syscall.ECONNREFUSED) {
			d = b.refused()
		} else {
			d = b.next()
		}
		f.retryDelay.Store(int64(d))
		if reason != logged {
			logged = reason
			f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower session failed; lookups pass through until it follows again",
				slog.String("reason", string(reason)), slog.Any("error", err),
				slog.Duration("retry_in", d), slog.Duration("followed", followed))
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

// session connects, resyncs or resumes, and applies changes until an
// error, or until the Loader asks for a resync (errResync). followed is
// how long it followed: from the marker's return to its end, 0 if the
// marker never came back.
func (f *Follower[K]) session(ctx context.Context) (followed time.Duration, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	requests := f.feed.Requests() // not f.feed in the goroutine: a later Run sets it
	go func() {
		select {
		case <-requests:
			cancel(errResync)
		case <-ctx.Done():
		}
	}()
	var since time.Time
	if f.notify {
		err = f.followNotify(ctx, &since)
	} else {
		err = f.followLogical(ctx, &since)
	}
	if !since.IsZero() {
		followed = time.Since(since)
	}
	if context.Cause(ctx) == errResync {
		return followed, errResync
	}
	return followed, err
}

// read records a completed full read of the table, for reason.
func (f *Follower[K]) read(ctx context.Context, reason ReadReason, keys int64, took time.Duration) {
	f.resyncs.Add(1)
	f.mu.Lock()
	f.reads[reason]++
	f.mu.Unlock()
	f.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: follower read the table",
		slog.String("reason", string(reason)),
		slog.Int64("keys", keys), slog.Duration("took", took))
}
