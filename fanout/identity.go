package fanout

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/nats-io/nats.go"
)

// route names the messages of one table of one database, as one relay
// publishes them:
//
//	<prefix>.<database>.<relay>.<table>.tx   the table's committed transactions (txMsg, JSON)
//	<prefix>.<database>.<relay>.<table>.ctl  the markers and heartbeats of its followers (ctlMsg, JSON)
//
// database is follow.Origin.Token, relay and table are Token of the
// relay's name and of the table ("schema.table"). Two databases, or two
// relays of one table, never share a subject. A follower consumes
// <subject>.> in stream order: a heartbeat comes after every transaction
// the relay published before it, which committed before it.
type route struct {
	db    follow.Origin
	relay string // Token(relay name)
	table string // Token(schema.table)
}

// subject returns the subjects' stem: <prefix>.<database>.<relay>.<table>.
func (r route) subject(prefix string) string {
	return prefix + "." + r.db.Token + "." + r.relay + "." + r.table
}

// control returns the route of the table's followers' control messages
// through the database (follow.Control): only this relay passes
// them on.
func (r route) control() string { return r.relay + "." + r.table }

// object returns the name of the table's saved guard in the bucket.
func (r route) object() string { return r.db.Token + "." + r.relay + "." + r.table }

// instance is one instance of a JetStream stream: a stream deleted and
// made again under the same name is another, whose sequence numbers mean
// nothing to a reader of the first.
type instance struct {
	name    string
	created time.Time
}

func (i instance) String() string {
	return fmt.Sprintf("stream %s created %s", i.name, i.created.UTC().Format(time.RFC3339Nano))
}

func (i instance) same(o instance) bool { return i.name == o.name && i.created.Equal(o.created) }

// mark is a place in a table's messages: the database they come from,
// the stream instance that holds them, the sequence of the last message
// read (or passed by), and what the table's messages up to it said: the
// epoch and LSN of its last transaction, and the highest relay term seen.
type mark struct {
	db    follow.Origin
	in    instance
	seq   uint64
	epoch string // "": none seen yet (an empty subject when the table was read)
	lsn   uint64
	term  uint64
}

// The headers of a saved guard that carry its mark.
const (
	headerDatabase = "Cuckooguard-Database"
	headerStream   = "Cuckooguard-Stream"
	headerCreated  = "Cuckooguard-Stream-Created"
	headerSeq      = "Cuckooguard-Seq"
	headerEpoch    = "Cuckooguard-Epoch"
	headerLSN      = "Cuckooguard-Lsn"
	headerTerm     = "Cuckooguard-Term"
)

// headers returns m as the headers of a saved guard.
func (m mark) headers() nats.Header {
	h := nats.Header{}
	h.Set(headerDatabase, m.db.Token)
	h.Set(headerStream, m.in.name)
	h.Set(headerCreated, m.in.created.UTC().Format(time.RFC3339Nano))
	h.Set(headerSeq, strconv.FormatUint(m.seq, 10))
	h.Set(headerEpoch, m.epoch)
	h.Set(headerLSN, strconv.FormatUint(m.lsn, 10))
	h.Set(headerTerm, strconv.FormatUint(m.term, 10))
	return h
}

// markOf reads the mark of a saved guard from its headers.
func markOf(h nats.Header) (mark, error) {
	var m mark
	if h == nil {
		return m, errors.New("no headers")
	}
	var err error
	m.db.Token = h.Get(headerDatabase)
	if err = follow.CheckToken(m.db.Token); err != nil {
		return m, err
	}
	m.in.name = h.Get(headerStream)
	if m.in.created, err = time.Parse(time.RFC3339Nano, h.Get(headerCreated)); err != nil {
		return m, fmt.Errorf("stream created: %w", err)
	}
	if m.seq, err = strconv.ParseUint(h.Get(headerSeq), 10, 64); err != nil {
		return m, fmt.Errorf("sequence: %w", err)
	}
	if m.lsn, err = strconv.ParseUint(h.Get(headerLSN), 10, 64); err != nil {
		return m, fmt.Errorf("LSN: %w", err)
	}
	if m.term, err = strconv.ParseUint(h.Get(headerTerm), 10, 64); err != nil {
		return m, fmt.Errorf("term: %w", err)
	}
	m.epoch = h.Get(headerEpoch)
	if m.in.name == "" {
		return m, errors.New("no stream name")
	}
	return m, nil
}
