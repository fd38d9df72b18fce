package postgres

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/internal/options"
)

// Option configures a Follower made by [NewFollower].
type Option func(*config)

type config struct {
	origin           string
	backoff          time.Duration
	maxLag           time.Duration
	heartbeat        time.Duration
	deadline         time.Duration
	logger           *slog.Logger
	notify           bool
	snapshotPath     string
	snapshotInterval time.Duration
	keyText          any           // func(K) string of the Follower's K; nil: keyTextOf
	registry         string        // the schema of cuckooguard_slots; "": the followed table's
	takeover         bool          // a Source ends another connection's stream of its slot (withSlotTakeover)
	maxBackoff       time.Duration // a Source's longest wait (WithMaxBackoff); 0: MaxBackoff
}

// Defaults of the Follower options.
const (
	// DefaultHeartbeat is how often a Follower sends itself a heartbeat.
	// With the default max lag it bounds how old a committed row can be
	// and still read absent on a following replica: under the max lag plus
	// a heartbeat, 250 ms.
	DefaultHeartbeat = 100 * time.Millisecond
	// DefaultMaxLag is the max lag with the default heartbeat: 1.5
	// heartbeats.
	DefaultMaxLag = 150 * time.Millisecond
	// DefaultHeartbeatDeadline is the shortest default heartbeat deadline:
	// it is three heartbeats, or this if longer.
	DefaultHeartbeatDeadline = time.Second
	// DefaultBackoff is the first reconnect delay.
	DefaultBackoff = 100 * time.Millisecond
	// DefaultSnapshotInterval is how often a Follower with a snapshot file
	// saves its guard, when its position in the stream has moved.
	DefaultSnapshotInterval = time.Minute
)

// discardLogger is the Follower's logger unless WithLogger sets one.
var discardLogger = slog.New(slog.DiscardHandler)

// WithLogger sets where the Follower logs: a session that failed (at Warn,
// once per change of [Reason] until a session follows for longer than the
// heartbeat deadline, with the error and the wait before it reconnects), a
// full read of the table and why it was needed, a snapshot file it could
// not use, and a first session that finds a setup that cannot work (at
// Error). Each line carries the table it follows as cuckooguard.table (a
// group of its own, so that it does not clash with the logger's own
// attributes). By default it logs nothing: a library speaks only when
// asked.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithHeartbeat sets how often the Follower sends itself a heartbeat
// through the database (a logical decoding message, or a NOTIFY with
// [WithNotify]) and expects it back in the change stream. A connection
// that is dead without being closed (a NAT or load balancer that dropped
// it, a half-open TCP session) delivers nothing and reports nothing; the
// heartbeat is how the Follower finds out. Each heartbeat is one tiny
// transaction. The default is [DefaultHeartbeat]; the heartbeat deadline
// ([WithHeartbeatDeadline]) and the max lag ([WithMaxLag]) default to
// multiples of it.
func WithHeartbeat(d time.Duration) Option {
	return func(c *config) { c.heartbeat = d }
}

// WithHeartbeatDeadline sets how long the stream may deliver nothing at
// all while a heartbeat is out before the Follower gives the connection
// up: it invalidates the Loader (every lookup passes through), drops the
// connection and reconnects. It also bounds connecting and the first
// heartbeat of a session. The default is 3× the heartbeat interval, or
// [DefaultHeartbeatDeadline] if that is longer.
func WithHeartbeatDeadline(d time.Duration) Option {
	return func(c *config) { c.deadline = d }
}

// WithMaxLag sets how late changes may arrive before the Follower
// considers itself behind: it then invalidates the Loader (every lookup
// passes through) until the lag is back under half of it. The lag is
// measured on this process's clock alone: the round trip of the last
// heartbeat, or the age of the oldest heartbeat not back yet, whichever is
// larger (changes arrive in commit order, so a heartbeat waits behind
// every change committed before it). The default is 1.5× the heartbeat
// interval ([DefaultMaxLag] with the default heartbeat). The Loader's
// readiness is a lease that runs out the max lag after the last heartbeat
// back was sent ([guarded.Feed.ReadyUntil]), compared with the clock by
// every lookup: a committed row reads absent on a following replica for
// at most the max lag, a paused process included. A max lag under the
// heartbeat interval plus its round trip lets the lease lapse between
// heartbeats, and lookups pass through then.
func WithMaxLag(d time.Duration) Option {
	return func(c *config) { c.maxLag = d }
}

// WithOrigin names this process among the processes that follow the
// table: a name of its own, the same across its restarts (a host or pod
// name), never shared with another process that runs at the same time. It
// names the process's replication slot, and shows in pg_stat_activity.
//
// Logical decoding keeps this process's position in a replication slot
// named after the table and the origin, which outlives a lost connection
// (the Follower resumes where it stopped, without reading the table) and
// a restart (with [WithSnapshotFile]). It also outlives a process that
// never comes back, and holds WAL on the server until it is dropped (see
// [DropStaleSlots]). Without an origin the slot is temporary and dies
// with the session: nothing is left behind, and every reconnect reads the
// whole table again. Either way the keys the process's own inserts name
// ([Follower.Tag]) are skipped, because its Loader added them itself.
func WithOrigin(origin string) Option {
	return func(c *config) { c.origin = origin }
}

// WithBackoff sets the first reconnect delay, in (0, [MaxBackoff]]. The
// delay doubles after each session that failed, up to MaxBackoff, and
// starts over after a session that followed for longer than the heartbeat
// deadline; each wait is drawn from the upper half of the delay. The
// default is [DefaultBackoff].
func WithBackoff(d time.Duration) Option {
	return func(c *config) { c.backoff = d }
}

// WithNotify follows the table through the trigger of [Install] and
// LISTEN/NOTIFY instead of logical decoding, for servers without it
// (wal_level below logical, a user without the REPLICATION attribute,
// PostgreSQL before 15). It costs the table's writers dearly: a
// transaction with a pending notification takes a lock on the whole
// instance at commit, so the table's commits run one at a time. With 16
// concurrent writers that measured 0.18× of the same table's insert
// throughput unfollowed, against 0.9× or better through logical decoding
// (see the README). It reads the whole table after every lost connection,
// and cannot save its guard ([WithSnapshotFile]).
func WithNotify() Option {
	return func(c *config) { c.notify = true }
}

// WithSnapshotFile makes the Follower save its guard to path with the
// position in the change stream it reflects, every [WithSnapshotInterval]
// and when Run returns, and start from it: a restarted process loads the
// file and streams the changes since that position, instead of reading the
// whole table. The file is written atomically (a temporary file in the
// same directory, renamed over it). A file that is missing, unreadable, of
// another table, or older than the replication slot's position, and a slot
// that is gone or lost its WAL, fall back to a full read, logged and
// counted (FollowerStats.FullReads). It needs [WithOrigin] (the slot must
// outlive the process) and logical decoding. The server keeps the WAL
// since the position last saved: see the README's sizing of
// max_slot_wal_keep_size.
func WithSnapshotFile(path string) Option {
	return func(c *config) { c.snapshotPath = path }
}

// WithSnapshotInterval sets how often the Follower saves its guard to the
// snapshot file when its position has moved. The default is
// [DefaultSnapshotInterval]. Each save writes the whole guard (about 2.5 MB
// per million keys) and pauses applying changes meanwhile.
func WithSnapshotInterval(d time.Duration) Option {
	return func(c *config) { c.snapshotInterval = d }
}

// WithKeyText sets how [Follower.Tag] writes a key of type K as text, for
// key types whose default form does not read back through the Follower's
// parse function. The default writes a string as it is, an integer in
// decimal, and anything else as fmt.Sprint prints it (a fmt.Stringer's
// String: a UUID's canonical form). The Follower compares keys, not
// texts: parse(text(k)) must give k. NewFollower returns an error for a
// function of another key type than its own.
func WithKeyText[K comparable](text func(K) string) Option {
	return func(c *config) { c.keyText = text }
}

// keyTextFor returns the key text function of c.keyText, which must be a
// func(K) string or nil (the default, keyTextOf).
func keyTextFor[K comparable](v any) (func(K) string, error) {
	if v == nil {
		return follow.KeyText[K](), nil
	}
	text, ok := v.(func(K) string)
	if !ok || text == nil {
		var zero K
		return nil, fmt.Errorf("postgres: WithKeyText needs a func(%T) string, the Follower's key type; got %T", zero, v)
	}
	return text, nil
}

// WithRegistry sets the schema of cuckooguard_slots, the small table where
// followers note when they last used their replication slot (for
// [DropStaleSlots]). By default it lives beside the followed table. Give
// the same schema to every function that takes it: NewFollower, [Publish]
// (which creates the table), [Slots], [DropStaleSlots] and [Unpublish]; the
// other options mean nothing to those. The followers' role needs SELECT, INSERT
// and UPDATE on the table (a follower that cannot write it logs so once
// and follows anyway, and DropStaleSlots then never finds its slot stale).
func WithRegistry(schema string) Option {
	return func(c *config) { c.registry = schema }
}

// adminConfig applies opts for an administrative function (Publish,
// Slots, ...), which only WithRegistry concerns.
func adminConfig(fn string, opts []Option) (config, error) {
	var c config
	err := options.Apply("postgres: "+fn, &c, opts)
	return c, err
}

// registryIn returns the quoted name of cuckooguard_slots for a table of
// schema, under c.
func (c *config) registryIn(schema string) string {
	return pgx.Identifier{cmp.Or(c.registry, schema), registry}.Sanitize()
}
