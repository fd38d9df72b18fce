package postgres

import (
	"log/slog"
	"time"
)

// FollowerOption configures a Follower.
type FollowerOption func(*followerConfig)

type followerConfig struct {
	origin    string
	backoff   time.Duration
	maxLag    time.Duration
	heartbeat time.Duration
	deadline  time.Duration
	logger    *slog.Logger
}

// Defaults of the Follower options.
const (
	// DefaultHeartbeat is how often a Follower sends itself a heartbeat.
	DefaultHeartbeat = time.Second
	// DefaultBackoff is the first reconnect delay.
	DefaultBackoff = 100 * time.Millisecond
)

// discardLogger is the Follower's logger unless WithLogger sets one.
var discardLogger = slog.New(slog.DiscardHandler)

// WithLogger sets where the Follower logs: a session that failed (at Warn,
// once per change of [Reason] until a session follows for longer than the
// heartbeat deadline, with the error and the wait before it reconnects),
// and a first session that finds a setup that cannot work (at Error). By
// default it logs nothing: a library speaks only when asked.
func WithLogger(l *slog.Logger) FollowerOption {
	return func(c *followerConfig) { c.logger = l }
}

// WithHeartbeat sets how often the Follower sends itself a heartbeat
// through the database (a NOTIFY on its channel) and expects it back on
// its LISTEN connection. A connection that is dead without being closed
// (a NAT or load balancer that dropped it, a half-open TCP session)
// delivers nothing and reports nothing; the heartbeat is how the Follower
// finds out. The default is [DefaultHeartbeat]; the heartbeat deadline
// ([WithHeartbeatDeadline]) and the max lag ([WithMaxLag]) default to
// multiples of it.
func WithHeartbeat(d time.Duration) FollowerOption {
	return func(c *followerConfig) { c.heartbeat = d }
}

// WithHeartbeatDeadline sets how long the LISTEN connection may deliver
// nothing at all while a heartbeat is out before the Follower gives it up:
// it invalidates the Loader (every lookup passes through), drops the
// connection, reconnects and resyncs. It also bounds connecting and the
// first heartbeat of a session. The default is 3× the heartbeat interval.
func WithHeartbeatDeadline(d time.Duration) FollowerOption {
	return func(c *followerConfig) { c.deadline = d }
}

// WithMaxLag sets how late notifications may arrive before the Follower
// considers itself behind: it then invalidates the Loader (every lookup
// passes through) until the lag is back under half of it. The lag is
// measured on this process's clock alone: the round trip of the last
// heartbeat, or the age of the oldest heartbeat not back yet, whichever is
// larger (notifications arrive in commit order, so a heartbeat waits
// behind every change committed before it). The default is 2× the
// heartbeat interval.
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

// WithBackoff sets the first reconnect delay, in (0, [MaxBackoff]]. The
// delay doubles after each session that failed, up to MaxBackoff, and
// starts over after a session that followed for longer than the heartbeat
// deadline; each wait is drawn from the upper half of the delay. The
// default is [DefaultBackoff].
func WithBackoff(d time.Duration) FollowerOption {
	return func(c *followerConfig) { c.backoff = d }
}
