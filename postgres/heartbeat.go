package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A session is one connection's worth of following, whichever the source
// (logical decoding or NOTIFY). Both send themselves the same markers and
// heartbeats through the database and expect them back in the change
// stream, in commit order behind every change committed before them:
//
//	"S <token>"        the marker, sent once the stream starts; when it is
//	                   back, every change committed before the stream began
//	                   has been applied, and the Loader is ready
//	"H <token>-<seq>"  a heartbeat, every WithHeartbeat
//
// The token tells this session's from other sessions' and followers'.
type session struct {
	hb        heartbeats
	pub       string          // the publication's version when the session began; "" with NOTIFY
	oid       string          // the table's oid, as the session resolved its name; "" with NOTIFY
	next      time.Time       // the next heartbeat is due
	beats     chan string     // payloads for the sender goroutine
	loopCtx   context.Context // ends when a heartbeat cannot be sent, or ctx ends
	endLoop   context.CancelCauseFunc
	senders   sync.WaitGroup
	following *time.Time // set when the marker comes back

	walsender *atomic.Pointer[walsender] // what the last heartbeat learned of it; nil with NOTIFY
	busySince time.Time                  // since when the stream is silent while its walsender works
}

// newToken returns a session token: unique among sessions and processes.
func newToken() string {
	return fmt.Sprintf("%x.%x", rand.Uint64(), time.Now().UnixNano())
}

// startSession sends the marker through send and starts the goroutine that
// sends the heartbeats: a send on a silent connection blocks until the
// deadline, and the session's loop must keep watching the lag meanwhile.
// A failed send ends the session through loopCtx. Call s.stop when the
// session ends, before send's connection closes.
func (f *Follower[K]) startSession(ctx context.Context, token, pub string, following *time.Time, send func(ctx context.Context, payload string) error) (*session, error) {
	s := &session{hb: heartbeats{session: token}, pub: pub, beats: make(chan string, 1), following: following}
	sent := time.Now() // before: what commits before the marker committed before it
	if err := send(ctx, "S "+token); err != nil {
		return nil, failed(ReasonConnectionLost, err)
	}
	s.hb.markerSent = sent
	s.hb.last = s.hb.markerSent
	s.next = s.hb.markerSent.Add(f.heartbeat)
	s.loopCtx, s.endLoop = context.WithCancelCause(ctx)
	s.senders.Go(func() {
		for {
			select {
			case <-s.loopCtx.Done():
				return
			case p := <-s.beats:
				if err := send(s.loopCtx, p); err != nil {
					reason := reasonFor(err, ReasonHeartbeatLost)
					if s.loopCtx.Err() == nil && reason == ReasonHeartbeatLost {
						f.beatsLost.Add(1) // the database did not take it within the deadline
					}
					s.endLoop(failed(reason, err))
					return
				}
			}
		}
	})
	return s, nil
}

// stop ends the session's heartbeats and waits for their sender.
func (s *session) stop() {
	s.endLoop(nil)
	s.senders.Wait()
}

// waitEnded returns why the session ends after one wait on the server
// (op names it) that returned err: ctx ended, the heartbeat loop ended
// (its cause), or the connection failed. A wait that timed out, to wake
// the session for its heartbeat, or that received something returns nil.
func (s *session) waitEnded(ctx context.Context, op string, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case s.loopCtx.Err() != nil:
		return context.Cause(s.loopCtx)
	case err != nil && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded):
		return failed(reasonFor(err, ReasonConnectionLost), fmt.Errorf("postgres: follower %s: %w", op, err))
	}
	return nil
}

// wakeCtx returns the context the session's next wait for the stream runs
// under: it ends when the session must look at its heartbeats.
func (f *Follower[K]) wakeCtx(s *session) (context.Context, context.CancelFunc) {
	return context.WithDeadline(s.loopCtx, f.wake(&s.hb, s.next, time.Now()))
}

// control handles a payload of a marker or a heartbeat that arrived at
// now. It reports false for any other payload. Through logical decoding a
// payload ends in the table's identity when it was sent (identityExpr):
// the oid its name resolved to, and the version of its publication. A
// marker or heartbeat of this session that says the name resolves to
// another table (errTableChanged), or that the publication changed since
// the session began (errPublicationChanged), ends it before it can
// confirm anything: the application reads another table than the guard
// holds, or the changes after the change may have been kept out of the
// stream.
func (f *Follower[K]) control(s *session, payload string, now time.Time) (bool, error) {
	op, rest, _ := strings.Cut(payload, " ")
	rest, identity, versioned := strings.Cut(rest, " ")
	switch op {
	case "S":
		if rest != s.hb.session {
			return true, nil // another session's marker
		}
		if versioned {
			if err := s.sameTable(identity); err != nil {
				return true, err
			}
		}
		if State(f.state.Load()) == Resyncing {
			// The marker went through the database and back behind every
			// change committed before it: a heartbeat's round trip.
			s.hb.rtt = now.Sub(s.hb.markerSent)
			s.hb.confirmedAt = s.hb.markerSent
			f.confirm(&s.hb)
			f.grant(s.hb.confirmedAt)
			f.state.Store(int32(Following))
			*s.following = now
		}
		return true, nil
	case "H":
		token, seqText, _ := strings.Cut(rest, "-")
		if token != s.hb.session {
			return true, nil // another session's
		}
		if versioned {
			if err := s.sameTable(identity); err != nil {
				return true, err
			}
		}
		if seq, err := strconv.ParseInt(seqText, 10, 64); err == nil && s.hb.back(seq, now) {
			f.lastBeat.Store(now.UnixNano())
			switch State(f.state.Load()) {
			case Following:
				f.confirm(&s.hb)
				f.grant(s.hb.confirmedAt)
			case Behind:
				f.confirm(&s.hb) // checkLag grants the lease when the lag allows
			}
		}
		return true, nil
	}
	return false, nil
}

// sameTable returns nil if identity, what a marker or heartbeat of the
// session says of the table (identityExpr), is what the session began
// with: the name resolves to the session's table, and its publication is
// at the session's version. Otherwise it returns the error that ends the
// session.
func (s *session) sameTable(identity string) error {
	oid, version, _ := strings.Cut(identity, " ")
	if oid != s.oid {
		return failed(ReasonTableChanged, fmt.Errorf("%w: the table's name resolves to oid %s, the follower follows oid %s (renamed, or dropped and created again): the application reads another table than the guard holds",
			errTableChanged, oid, s.oid))
	}
	if version != s.pub {
		return changed(s.pub, version)
	}
	return nil
}

// changed is the error of a session whose marker or heartbeat found the
// publication at version now, not was.
func changed(was, now string) error {
	return failed(ReasonPublication, fmt.Errorf("%w: the stream's publication changed while the follower followed (version %s, was %s): changes after it may be missing", errPublicationChanged, now, was))
}

// tick runs after every wait of the session, at now: it ends the session
// if the marker has not come back (noMarker says why) or the stream has
// gone silent, moves between Following and Behind, and sends the next
// heartbeat when it is due.
func (f *Follower[K]) tick(s *session, now time.Time, noMarker func(waited time.Duration) error) error {
	if State(f.state.Load()) == Resyncing {
		// Until the marker is back, a silent stream is a question for the
		// marker check alone: does it deliver nothing, or is it dead? A
		// walsender at work is neither (liveness.go).
		if now.Sub(s.hb.markerSent) > f.deadline && !f.busy(s.loopCtx, s, now) {
			return noMarker(now.Sub(s.hb.markerSent))
		}
	} else if len(s.hb.out) > 0 && now.Sub(s.hb.last) > f.deadline && !f.busy(s.loopCtx, s, now) {
		// Nothing at all for a deadline while a heartbeat is out, and the
		// walsender is not at work: the connection is dead, whether or
		// not it says so.
		f.beatsLost.Add(1)
		return failed(ReasonHeartbeatLost, fmt.Errorf("postgres: follower: nothing arrived for %v with a heartbeat out: the connection is dead%s",
			now.Sub(s.hb.last).Round(time.Millisecond), f.walsenderSays(s, now)))
	}
	f.checkLag(&s.hb, now)
	if !now.Before(s.next) {
		select {
		case s.beats <- fmt.Sprintf("H %s-%d", s.hb.session, s.hb.seq+1):
			s.hb.seq++
			s.hb.out = append(s.hb.out, beat{seq: s.hb.seq, sent: now})
			f.beats.Add(1)
			if State(f.state.Load()) != Resyncing {
				f.unconfirmed.CompareAndSwap(0, now.UnixNano())
			}
		default: // the last one is still being sent: it is out, and ages
		}
		s.next = now.Add(f.heartbeat)
	}
	return nil
}

// wake returns when the session must look at its heartbeats next, after
// now: the next heartbeat is due, or the moment the oldest one out makes
// the lag exceed the max lag, or the deadline runs out. Waking at the
// moment rather than at the next heartbeat tick is what bounds the time
// from a silent fault to pass-through by the heartbeat plus the max lag
// (the deadline, with the defaults), not that and one more heartbeat. A
// moment that has passed already (a deadline the session outlived while
// its walsender works) is not one: a read whose deadline has passed
// returns at once without reading the socket, and the session would spin
// beside a stream that delivers.
func (f *Follower[K]) wake(hb *heartbeats, next, now time.Time) time.Time {
	const past = time.Millisecond // the checks compare with >: be past the moment
	w := next
	at := func(t time.Time) {
		if t.After(now) && t.Before(w) {
			w = t
		}
	}
	if len(hb.out) > 0 {
		if State(f.state.Load()) == Following {
			at(hb.out[0].sent.Add(f.maxLag + past))
		}
		at(hb.last.Add(f.deadline + past))
	}
	if State(f.state.Load()) == Resyncing {
		at(hb.markerSent.Add(f.deadline + past))
	}
	if !w.After(now) {
		w = now.Add(past)
	}
	return w
}

// heartbeats is what a session knows of its heartbeats.
type heartbeats struct {
	session     string        // this session's token
	seq         int64         // of the last heartbeat sent
	out         []beat        // sent and not back yet, oldest first
	rtt         time.Duration // of the last one back
	last        time.Time     // when anything last arrived on the stream
	markerSent  time.Time
	confirmedAt time.Time // when the last marker or heartbeat back was sent: every change committed before it is applied
}

type beat struct {
	seq  int64
	sent time.Time
}

// back records that heartbeat seq came back at now.
func (hb *heartbeats) back(seq int64, now time.Time) bool {
	for i, b := range hb.out {
		if b.seq == seq {
			hb.rtt = now.Sub(b.sent)
			hb.confirmedAt = b.sent
			hb.out = hb.out[i+1:] // the stream is in commit order: older ones are lost or late
			return true
		}
	}
	return false
}

// confirm publishes what the session's heartbeats confirm: the round
// trip of the last one back, and since when the oldest one out has been
// out (none: every change committed before the last one back is applied).
func (f *Follower[K]) confirm(hb *heartbeats) {
	f.rtt.Store(int64(hb.rtt))
	f.currentAsOf.Store(hb.confirmedAt.UnixNano())
	var since int64
	if len(hb.out) > 0 {
		since = hb.out[0].sent.UnixNano()
	}
	f.unconfirmed.Store(since)
}

// lagAt is the lag at now: the round trip of the last heartbeat back, or
// the time since nothing confirms the guard, if longer. That is the age of
// the oldest heartbeat out or, between sessions, the time since the last
// session ended (or since Run began), so the lag keeps growing while no
// heartbeat comes back, with or without a connection.
func (f *Follower[K]) lagAt(now time.Time) time.Duration {
	lag := time.Duration(f.rtt.Load())
	if since := f.unconfirmed.Load(); since != 0 {
		lag = max(lag, now.Sub(time.Unix(0, since)))
	}
	return lag
}

// checkLag moves between Following and Behind by the lag at now.
func (f *Follower[K]) checkLag(hb *heartbeats, now time.Time) {
	lag := f.lagAt(now)
	switch st := State(f.state.Load()); {
	case st == Following && lag > f.maxLag:
		// Too late to trust: other replicas' rows may be missing for
		// longer than promised. Pass through until caught up.
		f.feed.Invalidate()
		f.state.Store(int32(Behind))
	case st == Behind && lag < f.maxLag/2:
		f.grant(hb.confirmedAt)
		f.state.Store(int32(Following))
	}
}

// grant makes the Loader ready until the max lag after asOf, when the
// last marker or heartbeat back was sent: every change committed before
// asOf is applied (a lease, [guarded.Feed.ReadyUntil]). Judged by when it
// was sent, a heartbeat that was out while this process was paused grants
// a lease that has run out already, and the Loader passes through until
// one sent after the pause comes back. The state that Stats reports is
// judged by the same lease, when it is read (stateAt).
func (f *Follower[K]) grant(asOf time.Time) {
	until := asOf.Add(f.maxLag)
	f.feed.ReadyUntil(until)
	f.readyTill.Set(until)
}

// stateAt is the follower's state at now: Following only while the lease
// of its last grant holds; Behind once it has run out, before the
// session's goroutine has seen it (a paused process, a stalled loop).
func (f *Follower[K]) stateAt(now time.Time) State {
	st := State(f.state.Load())
	if st == Following && !f.readyTill.Holds(now) {
		return Behind
	}
	return st
}
