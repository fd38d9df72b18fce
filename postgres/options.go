package postgres

import "time"

// FollowerOption configures a Follower.
type FollowerOption func(*followerConfig)

type followerConfig struct {
	origin    string
	backoff   time.Duration
	maxLag    time.Duration
	heartbeat time.Duration
	deadline  time.Duration
}

// Defaults of the Follower options.
const (
	// DefaultHeartbeat is how often a Follower sends itself a heartbeat.
	DefaultHeartbeat = time.Second
)

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

// WithBackoff sets the first reconnect delay, doubled after each failure
// up to 30 s, with jitter. The default is 100 ms.
func WithBackoff(d time.Duration) FollowerOption {
	return func(c *followerConfig) { c.backoff = d }
}
