package fanout

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Option configures a [Relay] or a [Follower].
type Option func(*config)

type config struct {
	stream     string
	prefix     string
	relay      string // the relay a follower follows (WithRelay)
	maxAge     time.Duration
	heartbeat  time.Duration // 0: the default of the Relay or the Follower
	deadline   time.Duration
	maxLag     time.Duration
	backoff    time.Duration
	logger     *slog.Logger
	origin     string
	bucket     string
	snapEvery  time.Duration
	snapWhen   func() bool
	keyText    any
	storage    jetstream.StorageType
	replicas   int
	duplicates time.Duration
}

// Defaults of the options.
const (
	DefaultStream        = "CUCKOOGUARD"
	DefaultSubjectPrefix = "cuckooguard"
	DefaultBucket        = "cuckooguard_snapshots"
	// DefaultHeartbeat is how often a Follower sends itself a heartbeat
	// through the database and the relay. With DefaultMaxLag it bounds how
	// old a committed row can be and still read absent on a ready replica:
	// under the max lag plus a heartbeat, 250 ms (see the README's faults
	// table).
	DefaultHeartbeat = 100 * time.Millisecond
	// DefaultMaxLag is how late a Follower's heartbeats may come back
	// before it passes lookups through.
	DefaultMaxLag = 150 * time.Millisecond
	// DefaultFollowerDeadline bounds a Follower's connecting and each of
	// its heartbeats' sends.
	DefaultFollowerDeadline = time.Second
	// DefaultRelayHeartbeat is how often the relay renews its lease and
	// checks its stream from the database, and how often a replica that is
	// not the relay tries to become it. Its lease lapses after three of
	// them without a renewal: a relay that hangs (a stopped process, a long
	// pause) is replaced within about 1.5 s.
	DefaultRelayHeartbeat = 500 * time.Millisecond
	// DefaultMaxAge is how long the stream keeps a message.
	DefaultMaxAge = 24 * time.Hour
	// DefaultSnapshotEvery is how often a Follower with WithSnapshots
	// saves its guard.
	DefaultSnapshotEvery = time.Minute
	// DefaultDuplicateWindow is how long JetStream remembers a message's
	// id, to drop what a relay publishes again after a reconnect; never
	// longer than the stream's max age.
	DefaultDuplicateWindow = 2 * time.Minute
	// MinMaxAge is the shortest WithMaxAge.
	MinMaxAge = time.Second
)

func defaults() config {
	return config{stream: DefaultStream, prefix: DefaultSubjectPrefix, maxAge: DefaultMaxAge,
		backoff: 100 * time.Millisecond, logger: slog.New(slog.DiscardHandler), bucket: DefaultBucket,
		snapEvery: DefaultSnapshotEvery, storage: jetstream.FileStorage, replicas: 1}
}

// check returns an error for options that cannot work, for fn.
func (c *config) check(fn string) error {
	switch {
	case c.heartbeat <= 0 || c.deadline <= c.heartbeat || c.maxLag <= 0 || c.backoff <= 0:
		return fmt.Errorf("%s: heartbeat %v, max lag %v and backoff %v must be positive, and the deadline %v longer than the heartbeat",
			fn, c.heartbeat, c.maxLag, c.backoff, c.deadline)
	case c.maxAge < MinMaxAge:
		return fmt.Errorf("%s: WithMaxAge %v is under the minimum %v", fn, c.maxAge, MinMaxAge)
	case c.stream == "" || c.prefix == "":
		return fmt.Errorf("%s: the stream's name and the subject prefix must not be empty", fn)
	case c.replicas < 1 || c.replicas > 5:
		return fmt.Errorf("%s: WithStreamReplicas %d is not in [1, 5]", fn, c.replicas)
	case c.logger == nil:
		return errors.New(fn + ": WithLogger needs a logger")
	}
	return nil
}

// WithStream names the JetStream stream (default [DefaultStream]). The
// relay creates it if it does not exist, for the subjects under the
// prefix; the relay and its followers must name the same. Relays of
// several databases, and several relays of one database, may share a
// stream: each database's and each relay's messages have subjects of their
// own.
func WithStream(name string) Option { return func(c *config) { c.stream = name } }

// WithSubjectPrefix sets the first token of the stream's subjects
// (default [DefaultSubjectPrefix]); see Token for the rest.
func WithSubjectPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithRelay names the relay a Follower follows: the name given to
// NewRelay. A Follower needs it: each relay's messages have subjects of
// their own, so that two services that relay one table do not read each
// other's.
func WithRelay(name string) Option { return func(c *config) { c.relay = name } }

// WithMaxAge sets how long the stream keeps a message (default
// [DefaultMaxAge], at least [MinMaxAge]). A follower that falls further
// behind, or starts from a snapshot older than that, reads the table
// instead. The stream's duplicate window is the shorter of this and
// [DefaultDuplicateWindow].
func WithMaxAge(d time.Duration) Option { return func(c *config) { c.maxAge = d } }

// WithStreamReplicas sets the number of the stream's replicas in a NATS
// cluster (default 1, at most 5), when the relay creates it.
func WithStreamReplicas(n int) Option { return func(c *config) { c.replicas = n } }

// WithHeartbeat sets how often a follower sends itself a heartbeat
// through the database, which comes back through the relay and the stream
// (default [DefaultHeartbeat]); its max lag then defaults to 1.5 times it.
// A follower passes lookups through once a heartbeat is out longer than
// the max lag, so a committed row can read absent on a ready replica for
// at most about the max lag plus a heartbeat. For a relay it sets how
// often it renews its lease and checks its stream (default
// [DefaultRelayHeartbeat]); the lease, and the relay's deadline, default
// to three times it.
func WithHeartbeat(d time.Duration) Option { return func(c *config) { c.heartbeat = d } }

// WithHeartbeatDeadline sets, for a follower, how long connecting and
// sending a heartbeat may take (default [DefaultFollowerDeadline], or
// three heartbeats if that is longer); for a relay, the lease: how long it
// keeps the right to relay without renewing it (default three
// heartbeats).
func WithHeartbeatDeadline(d time.Duration) Option {
	return func(c *config) { c.deadline = d }
}

// WithMaxLag sets how late a follower's heartbeats may come back before it
// passes lookups through (its Loader is invalid until the lag is under half
// of it again). The default is [DefaultMaxLag], or 1.5 heartbeats with
// WithHeartbeat. The Loader's readiness is a lease that runs out the max
// lag after the last heartbeat back was sent ([guarded.Feed.ReadyUntil]),
// compared with the clock by every lookup, so a committed row reads absent
// on a following replica for at most the max lag, a paused process
// included; a max lag under the heartbeat interval plus its round trip
// lets the lease lapse between heartbeats (lookups pass through then).
func WithMaxLag(d time.Duration) Option { return func(c *config) { c.maxLag = d } }

// WithBackoff sets the first wait before a failed session is made again;
// it doubles up to 2 s for a follower, 30 s for a relay's stream.
func WithBackoff(d time.Duration) Option { return func(c *config) { c.backoff = d } }

// WithLogger sets where a relay or a follower logs (by default nowhere).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithOrigin names this process among the followers' processes: it shows
// in pg_stat_activity and in its tags (Follower.Tag).
func WithOrigin(origin string) Option { return func(c *config) { c.origin = origin } }

// WithSnapshots makes a follower save its guard, with the place in the
// stream it reflects, to the JetStream object store bucket (default
// [DefaultBucket]) every interval while when() reports true (for
// example Relay.Leading: one replica saves), and start from the newest
// saved guard instead of reading the table: a new replica then reads
// nothing from the database. when may be nil: never save, but start from
// saved guards. A saved guard names the database, the relay and the
// stream instance it came from; one of another is not used.
func WithSnapshots(bucket string, every time.Duration, when func() bool) Option {
	return func(c *config) { c.bucket, c.snapEvery, c.snapWhen = bucket, every, when }
}

// WithKeyText sets how a follower's Tag writes a key as text (see
// postgres.WithKeyText).
func WithKeyText[K comparable](text func(K) string) Option {
	return func(c *config) { c.keyText = text }
}
