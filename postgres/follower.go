package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guard"
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

// errResync ends a session when a notification asks for a resync.
var errResync = errors.New("postgres: resync requested")

// Follower keeps a guard.Loader in step with the writes made to a table,
// from the notifications of the trigger of [Install].
//
// [Follower.Run] attaches itself to the Loader as its change feed
// ([guard.Loader.AttachFeed]), connects a dedicated connection, LISTENs,
// reads every key under a snapshot into a fresh guard
// ([guard.Loader.Resync]) and then applies each notification the read did
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
type Follower[K comparable, V any] struct {
	loader  *guard.Loader[K, V]
	dsn     string
	table   string
	key     string
	parse   func(string) (K, error)
	origin  string
	backoff time.Duration
	maxLag  time.Duration

	state       atomic.Int32
	lag         atomic.Int64 // of the last notification, nanoseconds
	applied     atomic.Int64
	skipped     atomic.Int64
	resyncs     atomic.Int64
	failures    atomic.Int64
	pid         atomic.Uint32
	lastApplied atomic.Int64 // unix nanoseconds
	mu          sync.Mutex   // protects lastErr
	lastErr     error
	resyncReq   chan struct{} // buffered 1: the Loader asked for a fresh guard
}

// FollowerOption configures a Follower.
type FollowerOption func(*followerConfig)

type followerConfig struct {
	origin  string
	backoff time.Duration
	maxLag  time.Duration
}

// WithMaxLag sets how late, from the row's change on the database clock to
// its notification arriving here, notifications may be before the
// Follower considers itself behind: it then invalidates the Loader (every
// lookup passes through) until the lag is back under half of it. The
// default is 5 s. The database and this process should share a clock
// (NTP).
func WithMaxLag(d time.Duration) FollowerOption {
	return func(c *followerConfig) { c.maxLag = d }
}

// WithOrigin sets this process's origin tag: notifications of inserts
// tagged with it ([TagOrigin]) are skipped, because this process's Loader
// added their keys itself. Deletes and key updates are applied whatever
// their origin. Tag the writes made through the Loader with the same
// origin; without tags every insert is applied twice here (one extra copy,
// a false positive, until the next resync), never missed.
func WithOrigin(origin string) FollowerOption {
	return func(c *followerConfig) { c.origin = origin }
}

// WithBackoff sets the first reconnect delay, doubled after each failure
// up to 30 s, with jitter. The default is 100 ms.
func WithBackoff(d time.Duration) FollowerOption {
	return func(c *followerConfig) { c.backoff = d }
}

// NewFollower returns a Follower that applies the changes of table's
// keyColumn, parsed with parse from their text form, to loader. dsn is a
// postgres:// URL; the Follower opens two connections of its own.
func NewFollower[K comparable, V any](loader *guard.Loader[K, V], dsn, table, keyColumn string, parse func(string) (K, error), opts ...FollowerOption) (*Follower[K, V], error) {
	c := followerConfig{backoff: 100 * time.Millisecond, maxLag: 5 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	if loader == nil || parse == nil || table == "" || keyColumn == "" {
		return nil, errors.New("postgres: NewFollower needs a loader, a table, a key column and a parse function")
	}
	if c.backoff <= 0 || c.maxLag <= 0 {
		return nil, fmt.Errorf("postgres: backoff %v and max lag %v must be positive", c.backoff, c.maxLag)
	}
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return nil, fmt.Errorf("postgres: follower: %w", err)
	}
	return &Follower[K, V]{loader: loader, dsn: dsn, table: table, key: keyColumn, parse: parse,
		origin: c.origin, backoff: c.backoff, maxLag: c.maxLag, resyncReq: make(chan struct{}, 1)}, nil
}

// Run follows the table until ctx ends, reconnecting after failures, and
// returns ctx.Err(). Until its first resync completes the Loader passes
// every lookup through, and when Run returns the Loader is invalid again
// (it cannot know what it misses without the feed). Run returns an error at
// once if the Loader has another change feed, such as a Follower whose Run
// has not returned.
func (f *Follower[K, V]) Run(ctx context.Context) error {
	detach, err := f.loader.AttachFeed(f.requestResync)
	if err != nil {
		return fmt.Errorf("postgres: follower: %w", err)
	}
	defer detach()
	delay := f.backoff
	for {
		err := f.session(ctx)
		f.loader.Invalidate()
		f.state.Store(int32(PassThrough))
		f.pid.Store(0)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errResync) {
			delay = f.backoff
			continue
		}
		f.failures.Add(1)
		f.mu.Lock()
		f.lastErr = err
		f.mu.Unlock()
		t := time.NewTimer(delay/2 + rand.N(delay))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// requestResync is the Loader's request for a fresh guard: the session
// in progress ends, and the next one resyncs. It does not block.
func (f *Follower[K, V]) requestResync() {
	select {
	case f.resyncReq <- struct{}{}:
	default: // one is pending already
	}
}

// session connects, resyncs and applies notifications until an error, or
// until the Loader asks for a resync (errResync).
func (f *Follower[K, V]) session(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-f.resyncReq:
			cancel(errResync)
		case <-ctx.Done():
		}
	}()
	err := f.follow(ctx)
	if context.Cause(ctx) == errResync {
		return errResync
	}
	return err
}

// follow is one session: connect, LISTEN, resync, apply.
func (f *Follower[K, V]) follow(ctx context.Context) error {
	listen, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		return fmt.Errorf("postgres: follower connect: %w", err)
	}
	defer listen.Close(context.WithoutCancel(ctx))
	f.pid.Store(listen.PgConn().PID())
	// LISTEN before the read: a write committed between the two reaches
	// us as a notification, and the snapshot tells whether the read saw it.
	if _, err := listen.Exec(ctx, "LISTEN "+pgx.Identifier{Channel(f.table)}.Sanitize()); err != nil {
		return fmt.Errorf("postgres: follower listen: %w", err)
	}
	f.state.Store(int32(Resyncing))
	sn, marker, err := f.resync(ctx)
	if err != nil {
		return err
	}
	f.resyncs.Add(1)
	// The Loader stays invalid until the marker sent after the read comes
	// back: every change committed during the read arrives before it and
	// is applied first.
	for {
		n, err := listen.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("postgres: follower wait: %w", err)
		}
		c, err := ParseChange(n.Payload)
		if err != nil {
			return err // a payload we do not understand: start over
		}
		if c.Op == Resync {
			return errResync
		}
		if c.Op == Marker {
			if c.Key == marker && State(f.state.Load()) == Resyncing {
				f.loader.MarkReady()
				f.state.Store(int32(Following))
			}
			continue // another follower's marker
		}
		lag := time.Since(time.UnixMicro(c.At))
		f.lag.Store(int64(lag))
		switch st := State(f.state.Load()); {
		case st == Following && lag > f.maxLag:
			// Too late to trust: other replicas' rows may be missing for
			// longer than promised. Pass through until caught up.
			f.loader.Invalidate()
			f.state.Store(int32(Behind))
		case st == Behind && lag < f.maxLag/2:
			f.loader.MarkReady()
			f.state.Store(int32(Following))
		}
		// Skip what the read saw, and this process's own inserts (its
		// Loader added them before writing). Its own deletes and updates
		// are applied here: the Loader's Delete removes nothing while a
		// feed is attached.
		if sn.Visible(c.TxID) || (f.origin != "" && c.Origin == f.origin && c.Op == Insert) {
			f.skipped.Add(1)
			continue
		}
		if err := f.apply(c); err != nil {
			return err
		}
		f.applied.Add(1)
		f.lastApplied.Store(time.Now().UnixNano())
	}
}

// resync reads every key under a snapshot into a fresh guard of the Loader
// and returns the snapshot.
//
// The snapshot is taken inside the Loader's Resync, after the fresh guard
// is installed for inserts: Resync waits for this process's inserts in
// flight, whose own notifications the follower skips, so each of them has
// either committed before the snapshot (and the read sees it) or reaches
// the fresh guard directly. Taken earlier, an insert that had added its key
// to the old guard only and committed after the snapshot would be lost.
func (f *Follower[K, V]) resync(ctx context.Context) (Snapshot, string, error) {
	reader, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		return Snapshot{}, "", fmt.Errorf("postgres: follower connect: %w", err)
	}
	defer reader.Close(context.WithoutCancel(ctx))
	query := fmt.Sprintf("SELECT %s::text FROM %s",
		pgx.Identifier{f.key}.Sanitize(), sanitizeTable(f.table))
	var sn Snapshot
	err = f.loader.Resync(ctx, func(ctx context.Context, add func(K) error, _ func(K)) error {
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
	// Notifications are delivered in commit order, so once this marker
	// arrives on the LISTEN connection, so has every change committed
	// before it, including those committed during the read.
	marker := fmt.Sprintf("%d-%d", reader.PgConn().PID(), rand.Uint64())
	if _, err := reader.Exec(ctx, `SELECT pg_notify($1, $2)`, Channel(f.table), "S "+marker); err != nil {
		return Snapshot{}, "", fmt.Errorf("postgres: follower marker: %w", err)
	}
	return sn, marker, nil
}

// apply applies one change to the Loader.
func (f *Follower[K, V]) apply(c Change) error {
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
		if err := f.loader.Apply(guard.Change[K]{Key: old, Deleted: true}); err != nil {
			return err
		}
	}
	k, err := parse(c.Key)
	if err != nil {
		return err
	}
	return f.loader.Apply(guard.Change[K]{Key: k, Deleted: c.Op == Delete})
}

// FollowerStats describes a Follower.
type FollowerStats struct {
	State       State
	Applied     int64         // notifications applied
	Skipped     int64         // notifications of own inserts, or seen by the last read
	Resyncs     int64         // completed reads of the whole table
	Failures    int64         // sessions that ended in an error
	BackendPID  uint32        // of the LISTEN connection, 0 when not connected
	Lag         time.Duration // of the last notification: from the row's change to its arrival
	LastApplied time.Time     // when the last notification was applied
	LastError   error
}

// Stats returns the Follower's statistics.
func (f *Follower[K, V]) Stats() FollowerStats {
	f.mu.Lock()
	lastErr := f.lastErr
	f.mu.Unlock()
	st := FollowerStats{
		State:      State(f.state.Load()),
		Applied:    f.applied.Load(),
		Skipped:    f.skipped.Load(),
		Resyncs:    f.resyncs.Load(),
		Failures:   f.failures.Load(),
		BackendPID: f.pid.Load(),
		Lag:        time.Duration(f.lag.Load()),
		LastError:  lastErr,
	}
	if ns := f.lastApplied.Load(); ns != 0 {
		st.LastApplied = time.Unix(0, ns)
	}
	return st
}
