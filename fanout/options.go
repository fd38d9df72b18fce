package fanout

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Option configures a [Relay] or a [Follower].
type Option func(*config)

type config struct {
	stream     string
	prefix     string
	maxAge     time.Duration
	heartbeat  time.Duration
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
	DefaultHeartbeat     = time.Second
	DefaultMaxAge        = 24 * time.Hour
	DefaultSnapshotEvery = time.Minute
)

func defaults() config {
	return config{stream: DefaultStream, prefix: DefaultSubjectPrefix, maxAge: DefaultMaxAge, heartbeat: DefaultHeartbeat,
		backoff: 100 * time.Millisecond, logger: slog.New(slog.DiscardHandler), bucket: DefaultBucket,
		snapEvery: DefaultSnapshotEvery, storage: jetstream.FileStorage, replicas: 1, duplicates: 2 * time.Minute}
}

// WithStream names the JetStream stream (default [DefaultStream]). The
// relay creates it if it does not exist, for the subjects under the
// prefix; the relay and its followers must name the same.
func WithStream(name string) Option { return func(c *config) { c.stream = name } }

// WithSubjectPrefix sets the first token of the stream's subjects
// (default [DefaultSubjectPrefix]); see Token for the rest.
func WithSubjectPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithMaxAge sets how long the stream keeps a message (default
// [DefaultMaxAge]). A follower that falls further behind, or starts from
// a snapshot older than that, reads the table instead.
func WithMaxAge(d time.Duration) Option { return func(c *config) { c.maxAge = d } }

// WithStreamReplicas sets the number of the stream's replicas in a NATS
// cluster (default 1), when the relay creates it.
func WithStreamReplicas(n int) Option { return func(c *config) { c.replicas = n } }

// WithHeartbeat sets how often a follower sends itself a heartbeat
// through the database, which comes back through the relay and the
// stream (default [DefaultHeartbeat]); the heartbeat deadline and the max
// lag default to 3 and 2 times it, as the postgres follower's. For a
// relay it is the heartbeat of its own stream from the database, and the
// interval at which a replica that is not the relay tries to become it.
func WithHeartbeat(d time.Duration) Option { return func(c *config) { c.heartbeat = d } }

// WithHeartbeatDeadline sets how long nothing may come back while a
// heartbeat is out before the session is given up and made again.
func WithHeartbeatDeadline(d time.Duration) Option { return func(c *config) { c.deadline = d } }

// WithMaxLag sets how late changes may arrive before a follower passes
// lookups through (its Loader is invalid until the lag is under half of
// it again).
func WithMaxLag(d time.Duration) Option { return func(c *config) { c.maxLag = d } }

// WithBackoff sets the first wait before a failed session is made again;
// it doubles up to 30 s.
func WithBackoff(d time.Duration) Option { return func(c *config) { c.backoff = d } }

// WithLogger sets where a relay or a follower logs (by default nowhere).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithOrigin names this process among the followers' processes: it shows
// in pg_stat_activity and in its tags (Follower.Tag).
func WithOrigin(origin string) Option { return func(c *config) { c.origin = origin } }

// WithSnapshots makes a follower save its guard, with the stream sequence
// it reflects, to the JetStream object store bucket (default
// [DefaultBucket]) every interval while when() reports true (for
// example Relay.Leading: one replica saves), and start from the newest
// saved guard instead of reading the table: a new replica then reads
// nothing from the database. when may be nil: never save, but start from
// saved guards.
func WithSnapshots(bucket string, every time.Duration, when func() bool) Option {
	return func(c *config) { c.bucket, c.snapEvery, c.snapWhen = bucket, every, when }
}

// WithKeyText sets how a follower's Tag writes a key as text (see
// postgres.WithKeyText).
func WithKeyText[K comparable](text func(K) string) Option {
	return func(c *config) { c.keyText = text }
}
