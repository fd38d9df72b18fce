package fanout

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/internal/options"
)

// Relay holds the one replication slot of a database's guarded tables and
// publishes every committed change of them, in commit order, to a NATS
// JetStream stream, one subject per database, relay and table, for
// [Follower]s that follow the stream instead of the database. The
// database then pays for one slot and one walsender, whatever the number
// of replicas and tables.
//
// Any replica can be the relay: every replica runs [Relay.Run], and the
// one that holds the relay's lease streams; the others try to take it
// every heartbeat. The lease is a PostgreSQL advisory lock in a
// transaction that the server ends when it sits idle for the lease's
// length: a relay that dies, hangs (a stopped process, a long pause, a
// frozen VM) or loses its connection loses the lease within it, and
// another replica takes the lease and the slot, ending the old relay's
// walsender if it still streams, and resumes from the slot. The relay
// confirms a position to PostgreSQL only once JetStream acknowledged every
// message up to it. Each lease has a term, larger than every earlier
// one's, which stamps the relay's messages: followers ignore a relay of an
// older term once they have seen a newer one, and a relay stops publishing
// as soon as its own clock says its lease may have lapsed (fencing).
//
// It publishes a transaction only once it is visible to new snapshots
// (see follow.Source), sizes the parts of a big one by their encoded
// bytes, makes the stream again if it is deleted, and passes on the tags
// of the transactions (Follower.Tag) and the markers and heartbeats that
// the followers send through the database, with where the table's
// transactions stood: a follower measures its lag from the database
// through the relay and the stream, and finds any message it missed.
//
// Relay is safe for concurrent use by multiple goroutines; Run is called
// once at a time.
type Relay struct {
	name string
	db   follow.Database
	js   jetstream.JetStream
	nc   *nats.Conn
	c    config
	src  follow.Source

	leading atomic.Bool
	term    atomic.Uint64 // of the lease held, or the last one
	publish atomic.Int64  // messages published
	resets  atomic.Int64
	terms   atomic.Int64 // times this process became the relay
	lapsed  atomic.Int64 // terms that ended because the lease may have lapsed
	mu      sync.Mutex   // protects lastErr
	lastErr error
}

// NewRelay returns a relay named name (the same for every replica of a
// service: it names the slot, the lease and the relay's subjects) of
// tables of db (postgres.Relayed; for PostgreSQL, published with
// postgres.Publish), through nc. Of the options,
// WithStream, WithSubjectPrefix, WithMaxAge, WithStreamReplicas,
// WithHeartbeat, WithHeartbeatDeadline, WithBackoff and WithLogger apply.
func NewRelay(db follow.Database, name string, nc *nats.Conn, tables []follow.Table, opts ...Option) (*Relay, error) {
	c := defaults()
	if err := options.Apply("fanout: NewRelay", &c, opts); err != nil {
		return nil, err
	}
	c.heartbeat = cmp.Or(c.heartbeat, DefaultRelayHeartbeat)
	c.deadline = cmp.Or(c.deadline, 3*c.heartbeat)
	c.maxLag = cmp.Or(c.maxLag, DefaultMaxLag) // a follower's; checked only for sign
	c.duplicates = min(DefaultDuplicateWindow, c.maxAge)
	if err := c.check("fanout: NewRelay"); err != nil {
		return nil, err
	}
	switch {
	case db == nil || nc == nil:
		return nil, errors.New("fanout: NewRelay needs a database and a NATS connection")
	case name == "":
		return nil, errors.New("fanout: NewRelay needs a name")
	}
	src, err := db.Source(name, tables, follow.SourceConfig{Heartbeat: c.heartbeat, Deadline: c.deadline, Backoff: c.backoff,
		MaxBackoff: max(c.backoff, time.Second), Logger: c.logger})
	if err != nil {
		return nil, err
	}
	// Acks are awaited in order (see relayHandler.reap); one that never
	// comes (a connection lost with the message in it) ends the session
	// within the deadline, and the next resumes from the slot.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*maxInFlight), jetstream.WithPublishAsyncTimeout(c.deadline))
	if err != nil {
		return nil, fmt.Errorf("fanout: %w", err)
	}
	c.logger = c.logger.With(slog.Group("cuckooguard", slog.String("relay", name)))
	return &Relay{name: name, db: db, js: js, nc: nc, c: c, src: src}, nil
}

// Leading reports whether this process is the relay now.
func (r *Relay) Leading() bool { return r.leading.Load() }

// RelayStats describes a Relay.
type RelayStats struct {
	Leading   bool
	Term      uint64 // the term of the lease held, or of the last one held
	Terms     int64  // times this process became the relay
	Lapsed    int64  // terms that ended because the lease may have lapsed (the process paused longer than the lease)
	Published int64  // messages published
	Resets    int64  // resets published: the followers of a table read it again
	Source    follow.SourceStats
	LastError error // why the last term ended, or the last campaign failed
}

// Stats returns the relay's statistics.
func (r *Relay) Stats() RelayStats {
	r.mu.Lock()
	last := r.lastErr
	r.mu.Unlock()
	return RelayStats{Leading: r.Leading(), Term: r.term.Load(), Terms: r.terms.Load(), Lapsed: r.lapsed.Load(),
		Published: r.publish.Load(), Resets: r.resets.Load(), Source: r.src.Stats(), LastError: last}
}

// errStreamGone ends a term whose stream was deleted or made again: the
// next term makes it again and starts the tables' messages anew.
var errStreamGone = errors.New("fanout: relay: the stream was deleted, or made again by another")

// errLeaseLapsed ends a term whose lease may have lapsed by this process's
// clock: another replica may hold it now.
var errLeaseLapsed = errors.New("fanout: relay: the lease may have lapsed (this process did not renew it in time)")

// Run campaigns to be the relay until ctx ends, and returns ctx.Err(),
// promptly whatever the database or the broker does: every heartbeat it
// tries to take the relay's lease; holding it, it streams the tables and
// publishes their changes until it loses the lease or ctx ends. It returns
// an error at once for a setup that cannot work
// (one the database's Permanent reports, such as
// postgres.ErrNotPublished or postgres.ErrKeyType; a stream the broker
// refuses to make).
func (r *Relay) Run(ctx context.Context) error {
	if ctx == nil {
		return errors.New("fanout: Relay.Run: ctx is nil")
	}
	// The async publisher's reply subscription lives on the caller's NATS
	// connection: a Run that returns leaves nothing behind on it.
	defer r.js.CleanupPublisher()
	var logged string
	for {
		led, err := r.campaign(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if r.permanent(err) {
			r.c.logger.LogAttrs(ctx, slog.LevelError, "cuckooguard: relay cannot run", slog.Any("error", err))
			return err
		}
		if err != nil {
			r.mu.Lock()
			r.lastErr = err
			r.mu.Unlock()
			switch {
			case led:
				// A term that ended is worth a line; a replica that only
				// failed to campaign (the database restarting) logs a
				// change of error once, at Info.
				r.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: relay term ended; another replica, or this one, takes over",
					slog.Any("error", err))
				logged = ""
			case err.Error() != logged:
				logged = err.Error()
				r.c.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: relay cannot campaign for the lease", slog.Any("error", err))
			}
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

// streamGone reports whether the stream that h's session started in was
// deleted or made again: a relay with nothing to publish would not notice.
func (r *Relay) streamGone(ctx context.Context, h *relayHandler) bool {
	started := h.in.Load()
	if started == nil {
		return false
	}
	si, err := streamInfo(ctx, r.js, r.c.stream, r.c.deadline)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return true
	case err != nil:
		return false // the broker is away: publishing fails, and tells
	}
	return !instanceOf(si).same(*started)
}

// permanent reports whether err is of a setup that cannot work.
func (r *Relay) permanent(err error) bool {
	return r.db.Permanent(err) || errors.Is(err, errStreamRefused)
}

// campaign tries to take the lease and, holding it, relays until it loses
// it. led reports whether it held the lease.
func (r *Relay) campaign(ctx context.Context) (led bool, err error) {
	l, err := r.db.Lease(ctx, r.name, r.c.deadline, r.c.deadline)
	if err != nil || l == nil {
		return false, err
	}
	defer l.Release()
	r.terms.Add(1)
	r.term.Store(l.Term())
	r.leading.Store(true)
	defer r.leading.Store(false)
	r.c.logger.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: this process is the relay", slog.Uint64("term", l.Term()))
	tctx, end := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer end(nil)
	h := &relayHandler{r: r, lease: l, end: end}
	wg.Go(func() { // the lease, renewed every heartbeat, and the stream, looked at
		t := time.NewTicker(r.c.heartbeat)
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-t.C:
				// Now, not the tick's time: a process that was stopped
				// finds a tick from before it stopped waiting.
				if !l.Held(time.Now()) {
					end(errLeaseLapsed)
					return
				}
				if err := l.Renew(tctx, r.c.deadline); err != nil && tctx.Err() == nil {
					end(err)
					return
				}
				if r.streamGone(tctx, h) {
					end(errStreamGone)
					return
				}
			}
		}
	})
	err = r.src.Run(tctx, h)
	if cause := context.Cause(tctx); cause != nil && ctx.Err() == nil {
		if errors.Is(cause, errLeaseLapsed) {
			r.lapsed.Add(1)
		}
		return true, cause
	}
	return true, err
}
