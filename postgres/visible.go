package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/jackc/pgx/v5"
)

// A transaction is decoded, and a Source could pass it on, as soon as its
// commit record is flushed; it becomes visible to other sessions'
// snapshots only when its backend leaves the list of running
// transactions, which a committing backend under synchronous replication
// does only once the standbys answered. A reader that takes a snapshot
// after it learned of a commit from the relay (the fanout follower's read
// of the table) would miss that commit's rows. So a Source passes a commit
// that changed a table on only once a snapshot taken after it was decoded
// sees it: what the handler gets is visible to every snapshot taken
// afterwards.
//
// The snapshots are taken on a connection of their own, by a goroutine of
// their own, while the session goes on decoding: the commits wait in order
// (copied, as the decoder reuses its buffers), and one snapshot releases
// every commit decoded before it was asked for. Asking once per commit
// and waiting for the answer held a relay to one commit per round trip.

// maxHeld is the most commits a Source holds back waiting to be visible;
// at it, the session stops reading the stream until some are released.
const maxHeld = 4096

// visibility holds a session's decoded commits until they are visible.
// Its methods run on the session's goroutine; the snapshots are taken by
// check's.
type visibility struct {
	s       *source
	held    []heldCommit
	seen    Snapshot // the newest snapshot: what it sees, every later one sees
	valid   bool
	asked   bool      // a snapshot was asked for and has not come
	nextAsk time.Time // no sooner than this, after one that released nothing
	pause   time.Duration
	since   time.Time // the first commit held was decoded then
	logged  bool      // the long wait of the first commit held was logged
	ask     chan struct{}
	answers chan snapshotAnswer
}

type heldCommit struct {
	c       follow.Commit
	changed bool // it changed a table: it waits to be visible
}

type snapshotAnswer struct {
	sn  Snapshot
	err error
}

// newVisibility starts the goroutine that takes snapshots on conn until
// ctx ends; wait for done before conn closes.
func newVisibility(ctx context.Context, s *source, conn *pgx.Conn) (v *visibility, done <-chan struct{}) {
	v = &visibility{s: s, ask: make(chan struct{}, 1), answers: make(chan snapshotAnswer, 1), pause: time.Millisecond}
	d := make(chan struct{})
	go func() {
		defer close(d)
		for {
			select {
			case <-ctx.Done():
				return
			case <-v.ask:
			}
			var text string
			qctx, cancel := context.WithTimeout(ctx, s.deadline)
			err := conn.QueryRow(qctx, `SELECT pg_current_snapshot()::text`).Scan(&text)
			cancel()
			var a snapshotAnswer
			if err != nil {
				a.err = failed(reasonFor(err, ReasonConnectionLost), fmt.Errorf("postgres: relay: read a snapshot: %w", err))
			} else if a.sn, a.err = ParseSnapshot(text); a.err != nil {
				a.err = failed(ReasonNotification, a.err)
			}
			select {
			case v.answers <- a:
			case <-ctx.Done():
				return
			}
		}
	}()
	return v, d
}

// pass hands c (a commit that changed a table if changed) to deliver at
// once if nothing is held and it is visible to the newest snapshot, or
// holds a copy of it until it is.
func (v *visibility) pass(c *follow.Commit, changed bool, deliver func(*follow.Commit) error) error {
	if len(v.held) == 0 && (!changed || v.valid && v.seen.VisibleXid(c.Xid)) {
		return deliver(c)
	}
	if len(v.held) == 0 {
		v.since, v.logged = time.Now(), false
	}
	cp := follow.Commit{Pos: c.Pos, Xid: c.Xid, Tags: slices.Clone(c.Tags), Controls: slices.Clone(c.Controls)}
	for _, t := range c.Tables {
		t.Creates, t.Deletes = slices.Clone(t.Creates), slices.Clone(t.Deletes)
		cp.Tables = append(cp.Tables, t)
	}
	v.held = append(v.held, heldCommit{c: cp, changed: changed})
	return nil
}

// holding reports whether commits are held.
func (v *visibility) holding() bool {
	return len(v.held) > 0
}

// release takes the snapshots that came, delivers the held commits they
// show visible, in order, and asks for another while some are held. With
// maxHeld commits held it waits (until ctx ends) for some to go.
func (v *visibility) release(ctx context.Context, deliver func(*follow.Commit) error) error {
	for {
		select {
		case a := <-v.answers:
			v.asked = false
			if a.err != nil {
				return a.err
			}
			v.seen, v.valid = a.sn, true
			n, err := v.deliverVisible(deliver)
			if err != nil {
				return err
			}
			if n > 0 {
				v.pause, v.nextAsk = time.Millisecond, time.Time{}
			} else {
				// Nothing visible yet (a commit waiting for a standby):
				// ask again after a pause, doubling to 50 ms.
				v.nextAsk = time.Now().Add(v.pause)
				v.pause = min(2*v.pause, 50*time.Millisecond)
			}
		default:
			if _, err := v.deliverVisible(deliver); err != nil {
				return err
			}
		}
		if len(v.held) == 0 {
			return nil
		}
		now := time.Now()
		if !v.logged && now.Sub(v.since) > v.s.deadline {
			v.logged = true
			v.s.log.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: relay: a committed transaction is not visible yet (a commit waiting for a synchronous standby?); the relay holds it and everything after it back until it is",
				slog.Uint64("xid", uint64(v.held[0].c.Xid)), slog.Duration("waited", now.Sub(v.since).Round(time.Millisecond)), slog.Int("held", len(v.held)))
		}
		if !v.asked && !now.Before(v.nextAsk) {
			v.asked = true
			v.s.visibilityWaits.Add(1)
			v.ask <- struct{}{}
		}
		if len(v.held) < maxHeld {
			return nil
		}
		// Full: wait for an answer before reading more of the stream.
		t := time.NewTimer(max(time.Until(v.nextAsk), time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case a := <-v.answers:
			t.Stop()
			v.answers <- a // taken again at the top
		case <-t.C:
		}
	}
}

// deliverVisible delivers the held commits the newest snapshot shows
// visible, from the first, and returns how many.
func (v *visibility) deliverVisible(deliver func(*follow.Commit) error) (int, error) {
	n := 0
	for len(v.held) > 0 {
		h := &v.held[0]
		if h.changed && !(v.valid && v.seen.VisibleXid(h.c.Xid)) {
			break
		}
		if err := deliver(&h.c); err != nil {
			return n, err
		}
		v.held[0] = heldCommit{}
		v.held = v.held[1:]
		n++
		v.since, v.logged = time.Now(), false
	}
	if len(v.held) == 0 {
		v.held = nil
	}
	return n, nil
}

// wake returns when the session must look again: soon, while commits are
// held (an answer may come, or the next ask be due).
func (v *visibility) wake(now time.Time) time.Time {
	if len(v.held) == 0 {
		return now.Add(time.Hour)
	}
	if !v.asked && v.nextAsk.After(now) {
		return v.nextAsk
	}
	return now.Add(time.Millisecond)
}
