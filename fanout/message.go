package fanout

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
)

// Token returns the subject token of a name (a table, as "schema.table",
// or a relay's name): its letters, digits, "_" and "-", the rest "_", and a
// hash of the whole name (names that differ only in what was replaced stay
// apart).
func Token(name string) string {
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '_'
	}, name)
	if len(clean) > 64 {
		clean = clean[:64]
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("%s_%08x", clean, h.Sum32())
}

// txMsg is one part of a table's committed transaction, or a reset.
type txMsg struct {
	// Epoch names the relay's run of this table's messages: a reset starts
	// one. Within an epoch each transaction's Prev is the LSN of the one
	// before it: a reader that finds another has missed messages.
	Epoch string `json:"e"`
	// Term is the term of the relay's lease it was published under: a
	// reader ignores what a relay of an older term publishes once it has
	// seen a newer one (a relay that hung, lost its lease and woke up).
	Term  uint64 `json:"t,omitempty"`
	DB    string `json:"db"`          // follow.Origin.Token of the database it comes from
	LSN   uint64 `json:"l"`           // the end of its commit record
	Prev  uint64 `json:"p"`           // the LSN of the epoch's previous transaction (its reset's, for the first)
	Xid   uint32 `json:"x,omitempty"` // its transaction id
	Tok   uint64 `json:"k,omitempty"` // its position in the stream of writers' tokens, where that is not LSN (follow.Commit.Token)
	Part  int    `json:"i,omitempty"` // of Parts: a big transaction comes in parts, each under the payload limit
	Parts int    `json:"n,omitempty"`

	Creates []string `json:"c,omitempty"`
	Deletes []string `json:"d,omitempty"`
	Tags    [][]byte `json:"g,omitempty"` // spread over the parts, after the keys

	// Reread: readers must read the table again after this message (a
	// TRUNCATE, a transaction bigger than the relay holds back, a key too
	// big for a message, or a reset: the relay's stream started anew, and
	// the changes between it and the last one are in no stream).
	Reread bool `json:"r,omitempty"`
	Reset  bool `json:"z,omitempty"`
	// Version is the version of the table's publication the relay
	// decoded under (follow.Start.Versions).
	Version string `json:"v,omitempty"`
	// OID is the oid of the table the relay decoded: the table its name
	// named when the relay's session began (0 from a relay of an earlier
	// version).
	OID uint64 `json:"o,omitempty"`
	// Rewound, on a reset: the relay found that the database went back
	// to an earlier point (a restore) while holding its lease: the
	// stream holds a term or an LSN that the database has not reached.
	// Its term may be older than those the stream holds; readers take
	// the reset all the same, and follow its term from then on.
	Rewound bool `json:"w,omitempty"`
}

// id returns the message id JetStream de-duplicates by: a relay that
// publishes a part again in the same term (after a lost connection) is
// dropped; a relay of another term is not, and readers skip what they have
// by its LSN.
func (m *txMsg) id() string { return fmt.Sprintf("%s:%d:%d:%d", m.Epoch, m.Term, m.LSN, m.Part) }

func (m *txMsg) encode() ([]byte, error) { return json.Marshal(m) }

func decodeTx(b []byte) (txMsg, error) {
	var m txMsg
	err := json.Unmarshal(b, &m)
	if err == nil && (m.Epoch == "" || m.DB == "" || m.Parts < 0 || m.Part < 0 || (m.Parts > 0 && m.Part >= m.Parts)) {
		err = fmt.Errorf("a message without an epoch or a database, or part %d of %d", m.Part, m.Parts)
	}
	if err != nil {
		return m, fmt.Errorf("fanout: decode a transaction message: %w", err)
	}
	return m, nil
}

// ctlMsg is a follower's marker or heartbeat as the relay passes it on,
// with where the table's transactions stood when it came: a reader whose
// last transaction is not Prev of Epoch has missed some, even if no
// transaction came since (a purged or aged-out stream, a consumer that
// skipped what was gone).
type ctlMsg struct {
	Epoch string `json:"e"`
	Term  uint64 `json:"t,omitempty"`
	Prev  uint64 `json:"p"`
	// LSN is the end of the commit record of the marker's or heartbeat's
	// own transaction: a follower that has applied Prev has applied every
	// change of the table committed before it, and reports it to its
	// Loader (guarded.Feed.Reached: consistency tokens). 0 from a relay of
	// an earlier version.
	LSN     uint64 `json:"l,omitempty"`
	Tok     uint64 `json:"k,omitempty"` // the position of LSN in the stream of writers' tokens, where that is not LSN (follow.Commit.Token)
	Payload string `json:"c"`
	// Seen is the identity of the table (follow.TableIdentity) that the
	// marker's or heartbeat's own transaction saw, and Table the identity
	// of the table the relay streams: equal, they prove that, as of the
	// message's commit, the stream is of the table its name names. ""
	// where the follower, or the relay, is of an earlier version.
	Seen  string `json:"s,omitempty"`
	Table string `json:"o,omitempty"`
}

func (m *ctlMsg) encode() ([]byte, error) { return json.Marshal(m) }

func decodeCtl(b []byte) (ctlMsg, error) {
	var m ctlMsg
	err := json.Unmarshal(b, &m)
	if err == nil && m.Epoch == "" {
		err = fmt.Errorf("a control message without an epoch")
	}
	if err != nil {
		return m, fmt.Errorf("fanout: decode a control message: %w", err)
	}
	return m, nil
}
