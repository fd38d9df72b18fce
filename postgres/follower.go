package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/options"
)

// State is what a Follower is doing.
type State int32

// The states of a Follower.
const (
	PassThrough State = iota // not connected: the Loader passes every lookup through
	Resyncing                // reading the table into a fresh guard; lookups pass through
	Following                // applying notifications as they arrive
	Behind                   // applying notifications more than the max lag late; lookups pass through
)

func (s State) String() string {
	switch s {
	case Resyncing:
		return "resyncing"
	case Following:
		return "following"
	case Behind:
		return "behind"
	default:
		return "pass-through"
	}
}

// Target is what a [Follower] keeps in step with a table: a
// *guarded.Loader[K, V] of any value type V. The Follower attaches itself
// as the Target's change feed ([guarded.Feed]), reads the table into a
// fresh guard through it, applies each change the read did not see, and
// invalidates the Target (every lookup passes through) whenever it cannot
// know what it misses.
type Target[K comparable] interface {
	AttachFeed() (*guarded.Feed[K], error)
}

// Follower keeps a [Target] (a *guarded.Loader) in step with the writes
// made to a table,
// from the notifications of the trigger of [Install].
//
// [Follower.Run] attaches itself to the Loader as its change feed
// ([guarded.Loader.AttachFeed]), connects a dedicated connection, LISTENs,
// reads every key under a snapshot into a fresh guard
// ([guarded.Loader.Resync]) and then applies each notification the read did
// not see, in commit order: every delete and key update, this process's
// own included, and the inserts of other processes. It skips only the
// inserts tagged with this process's own origin ([TagOrigin]), which its
// Loader added before writing them; the Loader's own deletes remove
// nothing themselves, so that each removal follows the creation it undoes
// (see FOLLOWER.md for the whole argument). If the connection drops, the
// Loader is invalidated (every lookup passes through), and Run reconnects
// with backoff and resyncs. When the Loader needs a fresh guard (a shard
// that cannot take a key, or too high a false-positive rate), Run resyncs
// too. No false negative at any point; other processes' writes become
// visible after the notification delay (the staleness, measured in the
// package tests).
//
// A Follower is safe for concurrent use: Run in one goroutine, Stats from
// any. A Loader follows one Follower at a time.
type Follower[K comparable] struct {
	loader    Target[K]
	conf      *pgx.ConnConfig // parsed dsn; each connection copies it
	table     string
	key       string
	parse     func(string) (K, error)
	origin    string
	backoff   time.Duration
	maxLag    time.Duration
	heartbeat time.Duration
	deadline  time.Duration

	log *slog.Logger

	state       atomic.Int32
	rtt         atomic.Int64 // nanoseconds: the round trip of the last heartbeat (or marker) back
	unconfirmed atomic.Int64 // unix nanoseconds since which nothing confirms the guard is current; 0: all confirmed
	retryDelay  atomic.Int64 // nanoseconds: the wait before the last reconnect
	applied     atomic.Int64
	skipped     atomic.Int64
	resyncs     atomic.Int64
	failures    atomic.Int64
	beats       atomic.Int64
	beatsLost   atomic.Int64 // sessions ended because heartbeats stopped coming back
	pid         atomic.Uint32
	lastApplied atomic.Int64 // unix nanoseconds
	lastBeat    atomic.Int64 // unix nanoseconds of the last heartbeat that came back
	mu          sync.Mutex   // protects lastErr and byReason
	lastErr     error
	byReason    map[Reason]int64
	feed        *guarded.Feed[K] // while Run runs
}

// NewFollower returns a Follower that applies the changes of table's
// keyColumn, parsed with parse from their text form, to loader. dsn is a
// postgres:// URL; the Follower opens two connections of its own.
func NewFollower[K comparable](loader Target[K], dsn, table, keyColumn string, parse func(string) (K, error), opts ...FollowerOption) (*Follower[K], error) {
	c := followerConfig{backoff: DefaultBackoff, heartbeat: DefaultHeartbeat, logger: discardLogger}
	if err := options.Apply("postgres: NewFollower", &c, opts); err != nil {
		return nil, err
	}
	if c.heartbeat > 0 {
		c.deadline = cmp.Or(c.deadline, 3*c.heartbeat)
		c.maxLag = cmp.Or(c.maxLag, 2*c.heartbeat)
	}
	if loader == nil || parse == nil || table == "" || keyColumn == "" {
		return nil, errors.New("postgres: NewFollower needs a loader, a table, a key column and a parse function")
	}
	if c.backoff <= 0 || c.backoff > MaxBackoff || c.maxLag <= 0 || c.heartbeat <= 0 || c.deadline <= c.heartbeat {
		return nil, fmt.Errorf("postgres: backoff %v must be in (0, %v], max lag %v and heartbeat %v positive, and the heartbeat deadline %v longer than the heartbeat",
			c.backoff, MaxBackoff, c.maxLag, c.heartbeat, c.deadline)
	}
	if c.logger == nil {
		return nil, errors.New("postgres: WithLogger needs a logger")
	}
	conf, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: follower: %w", err)
	}
	return &Follower[K]{loader: loader, conf: conf, table: table, key: keyColumn, parse: parse,
		origin: c.origin, backoff: c.backoff, maxLag: c.maxLag, heartbeat: c.heartbeat, deadline: c.deadline,
		log: c.logger, byReason: make(map[Reason]int64)}, nil
}

// Run follows the table until ctx ends, reconnecting after failures, and
// returns ctx.Err(). Until its first resync completes the Loader passes
// every lookup through, and when Run returns the Loader is invalid again
// (it cannot know what it misses without the feed). Run returns an error at
// once if the Loader has another change feed, such as a Follower whose Run
// has not returned, and after its first session if that session finds a
// setup that cannot work: [ErrNotInstalled] (no trigger of [Install] on the
// table) or [ErrNoNotifications] (the connection cannot LISTEN).
//
// After a failed session Run waits before it reconnects: the first delay
// ([WithBackoff]), doubled after each session that failed again, up to
// [MaxBackoff], each wait drawn from the upper half of the delay. A
// session that followed for longer than the heartbeat deadline starts the
// delays over. Each session's failure is counted by [Reason] and logged
// ([WithLogger]) when its reason differs from the last one's.
//
// The Follower's two connections show in pg_stat_activity with the
// application_name "cuckooguard follower listen" and "cuckooguard
// follower read", followed by the origin, unless the DSN sets one.
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
	f.unconfirmed.CompareAndSwap(0, time.Now().UnixNano()) // nothing confirmed yet
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
		if followed > f.deadline || errors.Is(err, errResync) {
			// A healthy session: the next fault is met with the first
			// delay, not with the one the last fault left.
			b.reset()
			logged = ""
		}
		if errors.Is(err, errResync) {
			continue
		}
		reason := reasonOf(err)
		f.failures.Add(1)
		f.mu.Lock()
		f.lastErr = err
		f.byReason[reason]++
		f.mu.Unlock()
		if first && (errors.Is(err, ErrNoNotifications) || errors.Is(err, ErrNotInstalled)) {
			// A connection that cannot LISTEN will not start to, nor
			// will a missing trigger appear: say so rather than leave
			// the Loader passing through for good. Later sessions retry:
			// a trigger dropped while running may come back.
			f.log.LogAttrs(ctx, slog.LevelError, "cuckooguard: follower cannot follow",
				slog.String("table", f.table), slog.String("reason", string(reason)), slog.Any("error", err))
			return err
		}
		d := b.next()
		f.retryDelay.Store(int64(d))
		if reason != logged {
			logged = reason
			f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower session failed; lookups pass through until it follows again",
				slog.String("table", f.table), slog.String("reason", string(reason)), slog.Any("error", err),
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

// session connects, resyncs and applies notifications until an error, or
// until the Loader asks for a resync (errResync). followed is how long it
// followed: from the marker's return to its end, 0 if the marker never
// came back.
func (f *Follower[K]) session(ctx context.Context) (followed time.Duration, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-f.feed.Requests():
			cancel(errResync)
		case <-ctx.Done():
		}
	}()
	var since time.Time
	err = f.follow(ctx, &since)
	if !since.IsZero() {
		followed = time.Since(since)
	}
	if context.Cause(ctx) == errResync {
		return followed, errResync
	}
	return followed, err
}

// follow is one session: connect, LISTEN, resync, apply, with a
// heartbeat. It sets *following when the marker comes back.
func (f *Follower[K]) follow(ctx context.Context, following *time.Time) error {
	listen, err := f.connect(ctx, "listen")
	if err != nil {
		return err
	}
	defer listen.Close(context.WithoutCancel(ctx))
	f.pid.Store(listen.PgConn().PID())
	// LISTEN before the read: a write committed between the two reaches
	// us as a notification, and the snapshot tells whether the read saw it.
	lctx, cancel := context.WithTimeout(ctx, f.deadline)
	_, err = listen.Exec(lctx, "LISTEN "+pgx.Identifier{Channel(f.table)}.Sanitize())
	cancel()
	if err != nil {
		return failed(ReasonListen, fmt.Errorf("postgres: follower listen: %w", err))
	}
	f.state.Store(int32(Resyncing))
	sender, err := f.connect(ctx, "read") // reads the table, then sends the heartbeats
	if err != nil {
		return err
	}
	defer sender.Close(context.WithoutCancel(ctx))
	// A table without the trigger sends nothing but our own heartbeats:
	// it would look healthy and miss every change.
	if err := checkInstalled(ctx, sender, f.table); err != nil {
		if errors.Is(err, ErrNotInstalled) {
			return failed(ReasonNotInstalled, err)
		}
		return failed(ReasonResync, err)
	}
	sn, session, err := f.resync(ctx, sender)
	if err != nil {
		return failed(ReasonResync, err)
	}
	f.resyncs.Add(1)
	// The Loader stays invalid until the marker sent after the read comes
	// back: every change committed during the read arrives before it and
	// is applied first. If it never comes, the connection cannot LISTEN.
	hb := heartbeats{session: session}
	if err := f.notify(ctx, sender, "S "+session); err != nil {
		return failed(ReasonConnectionLost, err)
	}
	hb.markerSent = time.Now()
	hb.last = hb.markerSent
	next := hb.markerSent.Add(f.heartbeat)
	// Heartbeats go out from a goroutine of their own: a NOTIFY on a
	// silent connection blocks until the deadline, and the loop must keep
	// watching the lag meanwhile. A failed send ends the session through
	// loopCtx.
	loopCtx, endLoop := context.WithCancelCause(ctx)
	defer endLoop(nil)
	beats := make(chan string, 1)
	var senderDone sync.WaitGroup
	senderDone.Go(func() {
		for {
			select {
			case <-loopCtx.Done():
				return
			case p := <-beats:
				if err := f.notify(loopCtx, sender, p); err != nil {
					if loopCtx.Err() == nil {
						f.beatsLost.Add(1) // the database did not take it within the deadline
					}
					endLoop(failed(ReasonHeartbeatLost, err))
					return
				}
			}
		}
	})
	defer senderDone.Wait() // before sender closes (deferred earlier)
	defer endLoop(nil)
	for {
		wctx, cancel := context.WithDeadline(loopCtx, f.wake(&hb, next))
		n, err := listen.WaitForNotification(wctx)
		cancel()
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case loopCtx.Err() != nil:
			return context.Cause(loopCtx)
		case err != nil && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded):
			return failed(ReasonConnectionLost, fmt.Errorf("postgres: follower wait: %w", err))
		case err == nil:
			hb.last = now
			if err := f.notification(n.Payload, sn, &hb, now); err != nil {
				return failed(ReasonNotification, err)
			}
			if State(f.state.Load()) != Resyncing && following.IsZero() {
				*following = now
			}
		}
		if State(f.state.Load()) == Resyncing {
			// Until the marker is back, a silent connection is a question
			// for the marker check alone: does it deliver nothing, or is
			// it dead?
			if now.Sub(hb.markerSent) > f.deadline {
				return f.noMarker(ctx, listen, now.Sub(hb.markerSent))
			}
		} else if len(hb.out) > 0 && now.Sub(hb.last) > f.deadline {
			// Nothing at all for a deadline while a heartbeat is out: the
			// connection is dead, whether or not it says so.
			f.beatsLost.Add(1)
			return failed(ReasonHeartbeatLost, fmt.Errorf("postgres: follower: no notification for %v with a heartbeat out: the LISTEN connection is dead",
				now.Sub(hb.last).Round(time.Millisecond)))
		}
		f.checkLag(now)
		if !now.Before(next) {
			select {
			case beats <- fmt.Sprintf("H %s-%d", session, hb.seq+1):
				hb.seq++
				hb.out = append(hb.out, beat{seq: hb.seq, sent: now})
				f.beats.Add(1)
				if State(f.state.Load()) != Resyncing {
					f.unconfirmed.CompareAndSwap(0, now.UnixNano())
				}
			default: // the last one is still being sent: it is out, and ages
			}
			next = now.Add(f.heartbeat)
		}
	}
}

// noMarker ends a session whose marker has not come back on the LISTEN
// connection after waited. If that connection still answers a query, it
// is alive and delivers no notifications: ErrNoNotifications (a PgBouncer
// in transaction pooling mode accepts LISTEN and delivers nothing). If it
// does not, it is dead, which a reconnect may mend.
func (f *Follower[K]) noMarker(ctx context.Context, listen *pgx.Conn, waited time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	if _, err := listen.Exec(pctx, "SELECT 1"); err != nil {
		return failed(ReasonConnectionLost, fmt.Errorf("postgres: follower: the marker sent %v ago has not come back, and the LISTEN connection does not answer: %w",
			waited.Round(time.Millisecond), err))
	}
	return failed(ReasonNoNotifications, fmt.Errorf("%w: the marker the follower sent %v ago through the database has not come back, though the LISTEN connection answers queries (a transaction-pooling PgBouncer delivers nothing)",
		ErrNoNotifications, waited.Round(time.Millisecond)))
}

// notification handles one payload.
func (f *Follower[K]) notification(payload string, sn Snapshot, hb *heartbeats, now time.Time) error {
	c, err := ParseChange(payload)
	if err != nil {
		return err // a payload we do not understand: start over
	}
	switch c.Op {
	case Resync:
		return errResync
	case Marker:
		if c.Key == hb.session && State(f.state.Load()) == Resyncing {
			// The marker went through the database and back behind every
			// change committed before it: a heartbeat's round trip.
			hb.rtt = now.Sub(hb.markerSent)
			f.confirm(hb)
			f.feed.MarkReady()
			f.state.Store(int32(Following))
		}
		return nil // or another follower's marker
	case Heartbeat:
		token, seqText, _ := strings.Cut(c.Key, "-")
		if token != hb.session {
			return nil // another follower's
		}
		if seq, err := strconv.ParseInt(seqText, 10, 64); err == nil && hb.back(seq, now) {
			f.lastBeat.Store(now.UnixNano())
			if State(f.state.Load()) != Resyncing {
				f.confirm(hb)
			}
		}
		return nil
	}
	// Skip what the read saw, and this process's own inserts (its Loader
	// added them before writing). Its own deletes and updates are applied
	// here: the Loader's Delete removes nothing while a feed is attached.
	if sn.Visible(c.TxID) || (f.origin != "" && c.Origin == f.origin && c.Op == Insert) {
		f.skipped.Add(1)
		return nil
	}
	if err := f.apply(c); err != nil {
		return err
	}
	f.applied.Add(1)
	f.lastApplied.Store(now.UnixNano())
	return nil
}

// connect opens a connection, within the heartbeat deadline: a database
// that does not answer is a failure like any other.
func (f *Follower[K]) connect(ctx context.Context, role string) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	conf := f.conf.Copy()
	// No prepared statements: through a pooler (PgBouncer), one server
	// connection serves many clients, whose cached statements collide
	// ("prepared statement stmtcache_… already exists"). The follower's
	// few statements gain nothing from preparing.
	conf.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	if conf.RuntimeParams["application_name"] == "" {
		// What pg_stat_activity shows: which follower, which connection.
		name := "cuckooguard follower " + role
		if f.origin != "" {
			name += " " + f.origin
		}
		conf.RuntimeParams["application_name"] = name // PostgreSQL truncates it to 63 bytes
	}
	c, err := pgx.ConnectConfig(cctx, conf)
	if err != nil {
		return nil, failed(ReasonConnect, fmt.Errorf("postgres: follower connect: %w", err))
	}
	return c, nil
}

// notify sends payload on the follower's channel through c, within the
// heartbeat deadline.
func (f *Follower[K]) notify(ctx context.Context, c *pgx.Conn, payload string) error {
	nctx, cancel := context.WithTimeout(ctx, f.deadline)
	defer cancel()
	if _, err := c.Exec(nctx, `SELECT pg_notify($1, $2)`, Channel(f.table), payload); err != nil {
		return fmt.Errorf("postgres: follower notify: %w", err)
	}
	return nil
}

// resync reads every key under a snapshot into a fresh guard of the Loader,
// on the connection reader, and returns the snapshot and a token for the
// session's marker and heartbeats.
//
// The snapshot is taken inside the Loader's Resync, after the fresh guard
// is installed for inserts: Resync waits for this process's inserts in
// flight, whose own notifications the follower skips, so each of them has
// either committed before the snapshot (and the read sees it) or reaches
// the fresh guard directly. Taken earlier, an insert that had added its key
// to the old guard only and committed after the snapshot would be lost.
func (f *Follower[K]) resync(ctx context.Context, reader *pgx.Conn) (Snapshot, string, error) {
	query := fmt.Sprintf("SELECT %s::text FROM %s",
		pgx.Identifier{f.key}.Sanitize(), sanitizeTable(f.table))
	var sn Snapshot
	err := f.feed.Resync(ctx, func(ctx context.Context, add func(K) error) error {
		tx, s, err := ReadSnapshot(ctx, reader)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		sn = s
		rows, err := tx.Query(ctx, query)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				return err
			}
			k, err := f.parse(s)
			if err != nil {
				return fmt.Errorf("parse key %q: %w", s, err)
			}
			if err := add(k); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	if err != nil {
		return Snapshot{}, "", fmt.Errorf("postgres: follower resync: %w", err)
	}
	// Notifications are delivered in commit order, so once the session's
	// marker (sent by follow) arrives, so has every change committed
	// before it, including those committed during the read.
	return sn, fmt.Sprintf("%d.%d", reader.PgConn().PID(), rand.Uint64()), nil
}

// apply applies one change to the Loader.
func (f *Follower[K]) apply(c Change) error {
	parse := func(s string) (K, error) {
		k, err := f.parse(s)
		if err != nil {
			return k, fmt.Errorf("postgres: follower: parse key %q: %w", s, err)
		}
		return k, nil
	}
	if c.Op == Update {
		old, err := parse(c.OldKey)
		if err != nil {
			return err
		}
		if err := f.feed.Apply(guarded.Change[K]{Key: old, Deleted: true}); err != nil {
			return err
		}
	}
	k, err := parse(c.Key)
	if err != nil {
		return err
	}
	return f.feed.Apply(guarded.Change[K]{Key: k, Deleted: c.Op == Delete})
}
