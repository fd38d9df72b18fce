package fanout

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
)

// The stream's subjects, under a prefix (WithSubjectPrefix, default
// "cuckooguard"), for a table the server resolves as schema.table:
//
//	<prefix>.<token>.tx   the table's committed transactions (txMsg, JSON)
//	<prefix>.<token>.ctl  the markers and heartbeats of its followers, as they sent them
//
// token is Token(schema.table). A follower consumes <prefix>.<token>.> in
// stream order: a heartbeat comes after every transaction the relay
// published before it, which committed before it.

// Token returns the subject token of a table, as "schema.table": its
// letters, digits, "_" and "-", the rest "_", and a hash of the whole name
// (names that differ only in what was replaced stay apart).
func Token(table string) string {
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '_'
	}, table)
	if len(clean) > 64 {
		clean = clean[:64]
	}
	h := fnv.New32a()
	h.Write([]byte(table))
	return fmt.Sprintf("%s_%08x", clean, h.Sum32())
}

// txMsg is one part of a table's committed transaction, or a reset.
type txMsg struct {
	// Epoch names the relay's run of this table's messages: a reset starts
	// one. Within an epoch each transaction's Prev is the LSN of the one
	// before it: a reader that finds another has missed messages.
	Epoch string `json:"e"`
	LSN   uint64 `json:"l"`           // the end of its commit record
	Prev  uint64 `json:"p"`           // the LSN of the epoch's previous transaction (its reset's, for the first)
	Xid   uint32 `json:"x,omitempty"` // its transaction id
	Part  int    `json:"i,omitempty"` // of Parts: a big transaction comes in parts, each under the payload limit
	Parts int    `json:"n,omitempty"`

	Creates []string `json:"c,omitempty"`
	Deletes []string `json:"d,omitempty"`
	Tags    [][]byte `json:"g,omitempty"` // in the last part

	// Reread: readers must read the table again after this message (a
	// TRUNCATE, a transaction bigger than the relay holds back, or a
	// reset: the relay's stream started anew, and the changes between it
	// and the last one are in no stream).
	Reread bool `json:"r,omitempty"`
	Reset  bool `json:"z,omitempty"`
	// Version is the version of the table's publication the relay
	// decoded under (postgres.SourceStart.Versions).
	Version string `json:"v,omitempty"`
}

func (m *txMsg) encode() ([]byte, error) { return json.Marshal(m) }

func decodeTx(b []byte) (txMsg, error) {
	var m txMsg
	err := json.Unmarshal(b, &m)
	if err == nil && (m.Epoch == "" || m.Parts < 0 || m.Part < 0 || (m.Parts > 0 && m.Part >= m.Parts)) {
		err = fmt.Errorf("a message without an epoch, or part %d of %d", m.Part, m.Parts)
	}
	if err != nil {
		return m, fmt.Errorf("fanout: decode a transaction message: %w", err)
	}
	return m, nil
}

// split returns the parts of transaction m (Creates and Deletes set),
// each under limit bytes of keys.
func split(m txMsg, limit int) []txMsg {
	size := func(keys []string) (n int) {
		for _, k := range keys {
			n += len(k) + 4
		}
		return n
	}
	if size(m.Creates)+size(m.Deletes) <= limit {
		return []txMsg{m}
	}
	var parts []txMsg
	cur := txMsg{Epoch: m.Epoch, LSN: m.LSN, Prev: m.Prev, Xid: m.Xid, Version: m.Version}
	n := 0
	add := func(deleted bool, k string) {
		if n+len(k)+4 > limit && n > 0 {
			parts = append(parts, cur)
			cur = txMsg{Epoch: m.Epoch, LSN: m.LSN, Prev: m.Prev, Xid: m.Xid, Version: m.Version}
			n = 0
		}
		if deleted {
			cur.Deletes = append(cur.Deletes, k)
		} else {
			cur.Creates = append(cur.Creates, k)
		}
		n += len(k) + 4
	}
	for _, k := range m.Creates {
		add(false, k)
	}
	for _, k := range m.Deletes {
		add(true, k)
	}
	parts = append(parts, cur)
	for i := range parts {
		parts[i].Part, parts[i].Parts = i, len(parts)
	}
	last := &parts[len(parts)-1]
	last.Tags, last.Reread = m.Tags, m.Reread
	return parts
}
