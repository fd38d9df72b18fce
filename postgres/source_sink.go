package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/jackc/pglogrepl"
)

// sourceSink passes a session's decoded transactions to the handler.
type sourceSink struct {
	s        *source
	ctx      context.Context
	h        follow.Handler
	token    string // the prefix of the session's own heartbeats
	c        follow.Commit
	controls []follow.Control
	beats    *sourceBeats
	need     pglogrepl.LSN // the last commit passed to the handler: it must confirm up to it
	free     pglogrepl.LSN // a position before which nothing waits for the handler
	partial  []bool        // per table: the open transaction's creations were dropped (spill)
	vis      *visibility
}

func (k *sourceSink) commit(t *txn) error {
	changed := t.overflow // a table's rows changed, or may have (spill)
	for i := range t.tables {
		changed = changed || t.tables[i].touched() || k.partial[i]
	}
	if !changed && len(k.controls) == 0 {
		if held := k.vis.holding(); !held {
			k.free = t.end // nothing of the tables: past it, nothing waits
		}
		k.controls = k.controls[:0]
		return nil
	}
	k.c = follow.Commit{Pos: uint64(t.end), Xid: t.xid, Tables: k.c.Tables[:0], Tags: t.tags, Controls: k.controls}
	for i := range t.tables {
		tt := &t.tables[i]
		incomplete := k.partial[i] || t.overflow
		k.c.Tables = append(k.c.Tables, follow.Changes{Creates: tt.creates, Deletes: tt.deletes, Truncated: tt.truncated, Incomplete: incomplete})
		k.partial[i] = false
	}
	// A commit that changed a table goes on once it is visible (see
	// visibility); one that carries only control messages changed no row,
	// but waits behind those held.
	err := k.vis.pass(&k.c, changed, k.deliver)
	k.controls = k.controls[:0]
	return err
}

// deliver passes c on to the handler.
func (k *sourceSink) deliver(c *follow.Commit) error {
	err := k.h.Commit(k.ctx, c)
	k.need = pglogrepl.LSN(c.Pos)
	k.s.commits.Add(1)
	return err
}

// spill drops the creations of a transaction too big to hold back: its
// commit marks the table incomplete, and the relay's readers read it
// again, rather than get creations the transaction's tags may not cover
// yet, at a position the commit has not told.
func (k *sourceSink) spill(table int, _ []string) error {
	k.partial[table] = true
	return nil
}

func (k *sourceSink) control(prefix, payload string) error {
	route, ok := strings.CutPrefix(prefix, controlPrefix+"/")
	switch {
	case !ok:
		return nil // a direct follower's
	case route == k.token:
		return k.beats.back(payload)
	}
	payload, id := splitIdentity(payload)
	k.controls = append(k.controls, follow.Control{Route: route, Payload: payload, Table: id})
	return nil
}

// confirmable returns the position the slot may move to: what the
// handler confirmed, and, once it confirmed every commit passed to it,
// the position before which nothing waits.
func (k *sourceSink) confirmable() pglogrepl.LSN {
	acked := pglogrepl.LSN(k.s.acked.Load())
	if acked >= k.need {
		return max(acked, k.free)
	}
	return acked
}

// sourceBeats is what a Source session knows of its heartbeats.
type sourceBeats struct {
	mu       sync.Mutex
	versions string // the tables' identities when the session began (identities)
	seq      int64
	out      []time.Time // sent and not back, oldest first, by seq-(seq-len(out)+1)
	probe    atomic.Pointer[walsender]
}

// back records that heartbeat payload ("<seq> <identities>") came back.
func (b *sourceBeats) back(payload string) error {
	seqText, versions, _ := strings.Cut(payload, " ")
	seq, err := strconv.ParseInt(seqText, 10, 64)
	if err != nil {
		return nil
	}
	if versions != b.versions {
		return failed(ReasonPublication, fmt.Errorf("%w: a table of the relay was renamed, dropped or made again, or its publication changed, while it streamed (identities %s, were %s)",
			errPublicationChanged, versions, b.versions))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	first := b.seq - int64(len(b.out)) + 1
	if n := seq - first + 1; n > 0 && n <= int64(len(b.out)) {
		b.out = b.out[n:]
	}
	return nil
}

// identities returns the heartbeat's form of the identities of rels, of
// the versions of their publications: what a Source's heartbeat must find
// while its session streams them (see Source.beat).
func identities(rels []relation, versions []string) string {
	parts := make([]string, len(rels))
	for i, r := range rels {
		parts[i] = follow.TableIdentity{ID: uint64(r.oid), Version: versions[i]}.String()
	}
	return strings.Join(parts, "|")
}
