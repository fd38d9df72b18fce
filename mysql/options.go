package mysql

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
)

// Option configures a Follower made by [NewFollower].
type Option func(*config)

type config struct {
	serverID       uint32
	backoff        time.Duration
	maxLag         time.Duration
	heartbeat      time.Duration
	deadline       time.Duration
	logger         *slog.Logger
	heartbeatTable string
	tagTable       string
	keyText        any // func(K) string of the Follower's K; nil: follow.KeyText
	snapshotPath   string
	snapshotEvery  time.Duration
}

// Defaults of the Follower options.
const (
	// DefaultHeartbeat is how often a Follower writes its heartbeat row.
	DefaultHeartbeat = 100 * time.Millisecond
	// DefaultMaxLag is how long after a heartbeat was written the Loader
	// stays ready on its evidence: 1.5 heartbeats.
	DefaultMaxLag = 150 * time.Millisecond
	// DefaultHeartbeatDeadline is the shortest default heartbeat deadline:
	// it is three heartbeats, or this if longer.
	DefaultHeartbeatDeadline = time.Second
	// DefaultBackoff is the first reconnect delay.
	DefaultBackoff = 100 * time.Millisecond
	// MaxBackoff is the longest wait between two sessions.
	MaxBackoff = 30 * time.Second
	// DefaultHeartbeatTable is the table of the Follower's heartbeat row,
	// in the DSN's database.
	DefaultHeartbeatTable = "cuckooguard_heartbeat"
	// DefaultTagTable is the table of the rows that [Follower.Tag] writes,
	// in the DSN's database.
	DefaultTagTable = "cuckooguard_tag"
	// DefaultSnapshotInterval is how often a Follower with a snapshot file
	// saves its guard, while its position moves.
	DefaultSnapshotInterval = time.Minute
)

// discardLogger is the Follower's logger unless WithLogger sets one.
var discardLogger = slog.New(slog.DiscardHandler)

// WithServerID sets the server id the Follower's binlog stream registers
// with, in [1, 2^32-1]. Every reader of a server's binlog (its replicas,
// every Follower) needs an id of its own and other than the server's:
// a second reader with the same id disconnects the first (error 4052),
// and two Followers with one id take the stream from each other, over and
// over (each session resumes, but follows for moments only). The default is drawn
// at random from [2^30, 2^31) for each Follower; give each process a
// stable id of its own to rule a collision out. The id also names the
// Follower's heartbeat row: with random ids each process start leaves a
// row of about 100 bytes behind in the heartbeat table.
func WithServerID(id uint32) Option {
	return func(c *config) { c.serverID = id }
}

// WithHeartbeat sets how often the Follower writes its heartbeat row, a
// new value each time (an UPDATE that changes nothing writes no event).
// It comes back through the binlog behind every change committed before
// it. The default is [DefaultHeartbeat]; each heartbeat is one
// autocommitted UPDATE of one row on the server.
func WithHeartbeat(d time.Duration) Option {
	return func(c *config) { c.heartbeat = d }
}

// WithMaxLag sets how long after a heartbeat was written the Loader may
// answer "absent" on the strength of its return: each heartbeat back
// makes the Loader ready until it was sent plus the max lag
// ([guarded.Feed.ReadyUntil]). The default is 1.5 heartbeats
// ([DefaultMaxLag] with the default heartbeat).
func WithMaxLag(d time.Duration) Option {
	return func(c *config) { c.maxLag = d }
}

// WithHeartbeatDeadline sets how long the stream may deliver nothing
// while a heartbeat is out before the Follower takes the connection for
// dead and starts a new session (which resumes where it stopped). The
// default is three heartbeats, at least [DefaultHeartbeatDeadline].
func WithHeartbeatDeadline(d time.Duration) Option {
	return func(c *config) { c.deadline = d }
}

// WithBackoff sets the first wait before a new session after a failed
// one; it doubles for each session that fails again, up to [MaxBackoff].
// The default is [DefaultBackoff].
func WithBackoff(d time.Duration) Option {
	return func(c *config) { c.backoff = d }
}

// WithLogger sets where the Follower logs: a session that failed (at
// Warn, once per change of reason), each read of the table (at Info) and
// a first session that finds a setup that cannot work (at Error). By
// default it logs nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithHeartbeatTable sets the table of the Follower's heartbeat row, in
// the DSN's database; the default is [DefaultHeartbeatTable]. The
// Follower creates it if missing (CREATE TABLE IF NOT EXISTS, which
// needs the CREATE privilege once) and writes its own row, keyed by its
// server id (INSERT and UPDATE).
func WithHeartbeatTable(name string) Option {
	return func(c *config) { c.heartbeatTable = name }
}

// WithSnapshotFile makes the Follower save its guard to path, with the
// binlog position it reflects and the deletions it still holds, every
// [WithSnapshotInterval] while the position moves and when Run returns;
// and start from it: a new process with the same file restores the guard
// and streams the binlog from that position, without reading the table,
// once it has proved the position as a resuming session does (the package
// doc's "Resuming"). A file that is missing, unreadable, of another table,
// server or layout, or whose position the server's binlog no longer holds
// or holds in another history, is not used: the Follower reads the table,
// logs why, and counts it (Stats.FullReads, Stats.ReadReason). The file
// is written atomically: a temporary file in path's directory, synced,
// renamed over path. A guard that passes some lookups through (a shard
// that could not take a key) is not saved; its file is removed. The
// default is no file.
func WithSnapshotFile(path string) Option {
	return func(c *config) { c.snapshotPath = path }
}

// WithSnapshotInterval sets how often the Follower saves its guard to the
// snapshot file while its position moves. The default is
// [DefaultSnapshotInterval]. Each save writes the whole guard (a few
// bytes per key) between two transactions, and applies nothing
// meanwhile.
func WithSnapshotInterval(d time.Duration) Option {
	return func(c *config) { c.snapshotEvery = d }
}

// WithTagTable sets the table that [Follower.Tag] writes its rows to (and
// deletes them from, in the same transaction), in the DSN's database; the
// default is [DefaultTagTable]. The Follower creates it at its first
// session if it is missing and its user may (CREATE TABLE IF NOT EXISTS);
// the writers' user needs INSERT and DELETE on it. Every process that
// follows the table with tags must name the same tag table.
func WithTagTable(name string) Option {
	return func(c *config) { c.tagTable = name }
}

// WithKeyText sets how the Follower writes a key of its type K as text,
// for the Loader's key rule: parse(text(k)) must give k. The default
// handles string and integer keys. NewFollower returns an error for a
// function of another key type than its own.
func WithKeyText[K comparable](text func(K) string) Option {
	return func(c *config) { c.keyText = text }
}

// keyTextFor returns the key text function of v, which must be a
// func(K) string or nil (the default, follow.KeyText).
func keyTextFor[K comparable](v any) (func(K) string, error) {
	if v == nil {
		return follow.KeyText[K](), nil
	}
	text, ok := v.(func(K) string)
	if !ok || text == nil {
		var zero K
		return nil, fmt.Errorf("mysql: WithKeyText needs a func(%T) string, the Follower's key type; got %T", zero, v)
	}
	return text, nil
}

// randomServerID is the default server id: one of 2^30, far from the
// small ids servers are usually given.
func randomServerID() uint32 { return 1<<30 + rand.Uint32N(1<<30) }
