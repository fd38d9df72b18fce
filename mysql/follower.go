package mysql

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"

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
	Resyncing   = follow.Resyncing   // reading the table, or waiting for the marker; lookups pass through
	Following   = follow.Following   // applying changes as they arrive, as a heartbeat sent less than the max lag ago proved
	Behind      = follow.Behind      // the last heartbeat back was sent more than the max lag ago; lookups pass through
)

// Target is what a [Follower] keeps in step with a table: a
// *guarded.Loader[K, V] of any value type V ([follow.Target]).
type Target[K comparable] = follow.Target[K]

// Follower keeps a [Target] (a *guarded.Loader) in step with the writes
// every process makes to a MySQL or MariaDB table, from the server's
// row-based binary log. See the package doc for what it promises and what
// the binlog cannot show.
//
// A Follower is safe for concurrent use: Run in one goroutine, Stats from
// any. A Loader follows one Follower at a time.
type Follower[K comparable] struct {
	loader    Target[K]
	srv       server
	table     string
	key       string
	parse     func(string) (K, error)
	text      func(K) string
	serverID  uint32
	hbTable   string
	tagTable  string
	backoff   time.Duration
	maxLag    time.Duration
	heartbeat time.Duration
	deadline  time.Duration
	log       *slog.Logger

	// Touched by Run's goroutine only.
	feed         *guarded.Feed[K]
	form         *keyForm            // the key column's form, as the last session read it
	formCol      column              // the column form was made for
	weights      map[string]*weights // by collation, as read from the server
	resume       *resumePoint        // where the next session may stream from; nil: it reads the table
	holds        holdings[K]         // deletions held until visible (visible.go)
	readReason   string              // why the next session reads the table, if it does
	snapPath     string              // the snapshot file; "" for none
	snapEvery    time.Duration
	fileTried    bool         // a session has tried to start from the snapshot file
	saved        time.Time    // when the file was last written (or tried)
	durable      positionMark // the position the file has
	degradedSaid bool
	tagSaid      bool   // a session has logged that it cannot create the tag table
	tokStream    string // the stream of the positions reported to the feed (token.go); "" before the first session
	tokDomain    uint32 // the GTID domain whose positions are reported

	tags *follow.Tagger[K] // this run's tags, and the key column's form for Key and Tag (tag.go)

	state     atomic.Int32
	readyTill mono.Deadline // until when Following holds
	rtt       atomic.Int64  // nanoseconds: the round trip of the last heartbeat (or marker) back
	asOf      atomic.Int64  // unix nanoseconds: when the last marker or heartbeat back was written
	applied   atomic.Int64
	beats     atomic.Int64
	reads     atomic.Int64
	resumes   atomic.Int64
	restores  atomic.Int64
	skipped   atomic.Int64
	snapshots atomic.Int64
	failures  atomic.Int64
	mu        sync.Mutex // protects lastErr, position, readWhy
	lastErr   error
	position  string // where the last session began
	readWhy   string // why the last read of the table happened
}

// validName is a table or column name the Follower quotes itself.
var validName = regexp.MustCompile(`^[A-Za-z0-9_$]+$`)

// NewFollower returns a Follower that applies the changes of table's
// keyColumn, parsed with parse from their text, to loader. dsn is a
// DSN in the form of github.com/go-sql-driver/mysql:
// user:password@tcp(host:port)/dbname, where dbname holds the table. The
// Follower opens three connections of its own: the table's read, its
// heartbeats, and the binlog stream.
//
// parse gets each key in its one text for the column (the package doc's
// "Key equality": the decimal text of an integer, a DECIMAL without
// trailing zeros, a text in the lowest character of each weight of a
// _general_ci collation, without trailing spaces under PAD SPACE); the
// Loader looks keys up in that form too ([guarded.Feed.SetKeyRule]), so
// a lookup in any text the server reads as the key finds it. NewFollower
// checks its arguments only; Run checks the server and the column.
func NewFollower[K comparable](loader Target[K], dsn, table, keyColumn string, parse func(string) (K, error), opts ...Option) (*Follower[K], error) {
	c := config{backoff: DefaultBackoff, heartbeat: DefaultHeartbeat, logger: discardLogger, heartbeatTable: DefaultHeartbeatTable,
		tagTable: DefaultTagTable, snapshotEvery: DefaultSnapshotInterval}
	if err := options.Apply("mysql: NewFollower", &c, opts); err != nil {
		return nil, err
	}
	if c.heartbeat > 0 {
		c.deadline = cmp.Or(c.deadline, max(3*c.heartbeat, DefaultHeartbeatDeadline))
		c.maxLag = cmp.Or(c.maxLag, c.heartbeat*3/2)
	}
	switch {
	case loader == nil || parse == nil || table == "" || keyColumn == "":
		return nil, errors.New("mysql: NewFollower needs a loader, a table, a key column and a parse function")
	case !validName.MatchString(table) || !validName.MatchString(keyColumn) || !validName.MatchString(c.heartbeatTable) || !validName.MatchString(c.tagTable):
		return nil, fmt.Errorf("mysql: NewFollower: table %q, key column %q, heartbeat table %q and tag table %q must be plain names (letters, digits, _ and $)",
			table, keyColumn, c.heartbeatTable, c.tagTable)
	case table == c.heartbeatTable || table == c.tagTable || c.heartbeatTable == c.tagTable:
		return nil, fmt.Errorf("mysql: NewFollower: table %s, heartbeat table %s and tag table %s must be three tables", table, c.heartbeatTable, c.tagTable)
	case c.backoff <= 0 || c.backoff > MaxBackoff || c.maxLag <= 0 || c.heartbeat <= 0 || c.deadline <= c.heartbeat:
		return nil, fmt.Errorf("mysql: backoff %v must be in (0, %v], max lag %v and heartbeat %v positive, and the heartbeat deadline %v longer than the heartbeat",
			c.backoff, MaxBackoff, c.maxLag, c.heartbeat, c.deadline)
	case c.logger == nil:
		return nil, errors.New("mysql: WithLogger needs a logger")
	case c.snapshotEvery <= 0:
		return nil, fmt.Errorf("mysql: the snapshot interval %v must be positive", c.snapshotEvery)
	}
	srv, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	text, err := keyTextFor[K](c.keyText)
	if err != nil {
		return nil, err
	}
	id := c.serverID
	if id == 0 {
		id = randomServerID()
	}
	f := &Follower[K]{loader: loader, srv: srv, table: table, key: keyColumn, parse: parse, text: text,
		serverID: id, hbTable: c.heartbeatTable, tagTable: c.tagTable, backoff: c.backoff, maxLag: c.maxLag,
		heartbeat: c.heartbeat, deadline: c.deadline,
		log:        c.logger.With(slog.Group("cuckooguard", slog.String("table", table))),
		weights:    make(map[string]*weights),
		readReason: "the first session",
		snapPath:   c.snapshotPath, snapEvery: c.snapshotEvery}
	f.holds.drop()
	if f.tags, err = follow.NewTagger(strconv.FormatUint(uint64(id), 10), parse, text); err != nil {
		return nil, err
	}
	// Key reads the column's form through a connection of its own until
	// a session has read it (useForm).
	f.tags.SetColumn(keyColumnOf(srv, table, keyColumn, f.deadline))
	return f, nil
}

// Run follows the table until ctx ends, reconnecting after failures, and
// returns ctx.Err(). The first session checks the server and the table,
// reads every key in a consistent snapshot into a fresh guard, streams the
// binlog from the snapshot's own position, and marks the Loader ready
// once its marker is back. After a lost connection, a server restart,
// another reader with the Follower's server id or a heartbeat that does
// not come back, the next session resumes from the last transaction it
// applied, without reading the table, if it can prove that the server's
// binlog is still the one it followed (the package doc's "Resuming");
// after DDL or TRUNCATE on the table, a purged or reset binlog, or a
// position it cannot prove, it reads the table again. Until a session
// follows, and between sessions, the Loader passes every lookup through.
// Run returns an error at once if the Loader has another change feed, and
// after its first session if that session found a setup that cannot work
// ([ErrSetup], [ErrKeyType]).
func (f *Follower[K]) Run(ctx context.Context) error {
	if ctx == nil {
		return errors.New("mysql: Follower.Run: ctx is nil")
	}
	feed, err := f.loader.AttachFeed()
	if err != nil {
		return fmt.Errorf("mysql: follower: %w", err)
	}
	f.feed = feed
	defer feed.Detach()
	defer f.saveOnExit() // before Detach: the guard is still the Loader's
	first, delay := true, f.backoff
	var logged string
	for {
		followed, err := f.session(ctx)
		feed.Invalidate()
		f.state.Store(int32(PassThrough))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		again := readAgain(err)
		if sessionEnded != nil && f.resume != nil && !again {
			sessionEnded(*f.resume)
		}
		switch {
		case again:
			f.resume = nil
			f.readReason = err.Error()
		case f.resume == nil:
			f.readReason = "the last session ended before it applied a transaction: " + err.Error()
		}
		if followed > f.deadline || errors.Is(err, errTableChanged) || errors.Is(err, errBigTransaction) || errors.Is(err, errResync) || errors.Is(err, errHistory) {
			delay, logged = f.backoff, "" // a healthy session: start the delays over
		}
		f.failures.Add(1)
		f.mu.Lock()
		f.lastErr = err
		f.mu.Unlock()
		if first && (errors.Is(err, ErrSetup) || errors.Is(err, ErrKeyType)) {
			f.log.LogAttrs(ctx, slog.LevelError, "cuckooguard: follower cannot follow", slog.Any("error", err))
			return err
		}
		first = false
		if errors.Is(err, errTableChanged) || errors.Is(err, errBigTransaction) || errors.Is(err, errResync) || errors.Is(err, errHistory) {
			f.log.LogAttrs(ctx, slog.LevelInfo, "cuckooguard: follower reads the table again", slog.Any("error", err))
			continue
		}
		d := delay/2 + rand.N(delay/2+1)
		delay = min(2*delay, MaxBackoff)
		if msg := err.Error(); msg != logged {
			logged = msg
			f.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: follower session failed; lookups pass through until it follows again",
				slog.Any("error", err), slog.Duration("retry_in", d), slog.Duration("followed", followed), slog.Bool("resumes", f.resume != nil))
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

// readAgain reports whether a session that ended with err leaves nothing
// the next one may resume from: the table changed, the Loader wants a
// fresh guard, the binlog is not the one followed (or cannot be read from
// the position: error 1236), the stream sent an event that cannot be
// decoded, or the setup is wrong. A lost connection,
// a server restart, error 4052 and a heartbeat deadline leave the guard
// as it was after the last transaction applied.
func readAgain(err error) bool {
	var me *gomysql.MyError
	return errors.Is(err, errTableChanged) || errors.Is(err, errBigTransaction) || errors.Is(err, errResync) ||
		errors.Is(err, errHistory) || errors.Is(err, errUndecodable) || errors.Is(err, ErrSetup) || errors.Is(err, ErrKeyType) ||
		errors.As(err, &me) && me.Code == gomysql.ER_MASTER_FATAL_ERROR_READING_BINLOG
}

// Stats is what a Follower has done. It is not a snapshot: each field is
// read on its own.
type Stats struct {
	State       State
	Lag         time.Duration // the round trip of the last heartbeat (or marker) back
	CurrentAsOf time.Time     // every change committed before it has been applied: when the last heartbeat back was written
	Applied     int64         // changes applied to the Loader from the binlog
	Heartbeats  int64         // heartbeats written
	FullReads   int64         // reads of the whole table
	Resumes     int64         // sessions that resumed where the last one stopped (or the snapshot file), without reading the table
	Restores    int64         // guards restored from the snapshot file
	Snapshots   int64         // snapshot files written
	Skipped     int64         // inserts skipped as this process's own (Follower.Tag)
	Failures    int64         // sessions that ended
	LastError   error         // why the last session ended
	Position    string        // where the last session began: the read's file:pos and GTID, or the transaction it resumed after
	ReadReason  string        // why the last read of the whole table happened
	ServerID    uint32        // the binlog stream's server id
}

// Stats returns the Follower's counters. The state is judged by the
// Loader's lease when Stats is called: Following only while the last
// heartbeat back was sent less than the max lag ago.
func (f *Follower[K]) Stats() Stats {
	st := State(f.state.Load())
	if st == Following && !f.readyTill.Holds(time.Now()) {
		st = Behind
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var asOf time.Time
	if n := f.asOf.Load(); n != 0 {
		asOf = time.Unix(0, n)
	}
	return Stats{State: st, Lag: time.Duration(f.rtt.Load()), CurrentAsOf: asOf, Applied: f.applied.Load(), Heartbeats: f.beats.Load(),
		FullReads: f.reads.Load(), Resumes: f.resumes.Load(), Restores: f.restores.Load(), Snapshots: f.snapshots.Load(), Skipped: f.skipped.Load(), Failures: f.failures.Load(), LastError: f.lastErr, Position: f.position, ReadReason: f.readWhy, ServerID: f.serverID}
}

// grant makes the Loader ready until the max lag after sent, when the
// last marker or heartbeat back was written: every change committed
// before it has been applied.
func (f *Follower[K]) grant(sent time.Time) {
	until := sent.Add(f.maxLag)
	f.feed.ReadyUntil(until)
	f.readyTill.Set(until)
	f.asOf.Store(sent.UnixNano())
}
