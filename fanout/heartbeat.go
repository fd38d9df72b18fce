package fanout

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
)

// followed returns how long the session followed, at now.
func (s *fsession[K]) followed(now time.Time) time.Duration {
	if s.since.IsZero() {
		return 0
	}
	return now.Sub(s.since)
}

// wake returns how long until the session must look at its heartbeats:
// the next one is due, or the oldest one out makes the lag pass the max
// lag. The session's loop wakes then whether a message comes or not.
func (s *fsession[K]) wake(now time.Time) time.Duration {
	w := s.next
	if len(s.out) > 0 && follow.State(s.f.state.Load()) == follow.Following {
		if t := s.out[0].sent.Add(s.f.c.maxLag + time.Millisecond); t.After(now) && t.Before(w) {
			w = t
		}
	}
	return w.Sub(now)
}

// control handles a marker or heartbeat that came back at now. It reports
// whether the marker was lost: one of the session's heartbeats, which it
// sends after its marker, came back while the marker had not.
func (s *fsession[K]) control(payload string, now time.Time) (markerLost bool) {
	f := s.f
	op, rest, _ := strings.Cut(payload, " ")
	switch op {
	case "S":
		if rest != s.token || follow.State(f.state.Load()) != follow.Resyncing {
			return
		}
		// Every change committed before the marker, the transactions the
		// last read saw among them, has come: none is left to skip.
		f.pos.skip = nil
		f.rtt.Store(int64(now.Sub(s.markerSent)))
		s.asOf = s.markerSent
		f.currentAsOf.Store(s.asOf.UnixNano())
		f.unconfirmed.Store(s.oldestOut())
		s.grant()
		f.state.Store(int32(follow.Following))
		f.followedOnce = true
		s.since = now
		if f.down != "" {
			f.c.logger.LogAttrs(context.Background(), slog.LevelInfo, "cuckooguard: fanout follower follows again",
				slog.String("after", f.down))
			f.down = ""
		}
	case "H":
		token, seqText, _ := strings.Cut(rest, "-")
		seq, err := strconv.ParseInt(seqText, 10, 64)
		if token != s.token || err != nil {
			return
		}
		for i, b := range s.out {
			if b.seq == seq {
				f.rtt.Store(int64(now.Sub(b.sent)))
				s.out = s.out[i+1:]
				if s.since.IsZero() && follow.State(f.state.Load()) == follow.Resyncing {
					return true
				}
				if st := follow.State(f.state.Load()); st != follow.Resyncing {
					s.asOf = b.sent
					f.currentAsOf.Store(s.asOf.UnixNano())
					f.unconfirmed.Store(s.oldestOut())
					if st == follow.Following {
						s.grant() // Behind: tick grants it when the lag allows
					}
				}
				break
			}
		}
	}
	return false
}

func (s *fsession[K]) oldestOut() int64 {
	if len(s.out) == 0 {
		return 0
	}
	return s.out[0].sent.UnixNano()
}

// tick sends the next heartbeat when it is due and moves between
// Following and Behind by the lag. A follower whose heartbeats do not come
// back (a relay that is down, or taking over; a stream or a broker that
// stalls) passes through; it does not reconnect for that: its consumer,
// and its connections, tell it when they fail.
func (s *fsession[K]) tick(now time.Time) {
	f := s.f
	if !now.Before(s.next) {
		select {
		case s.send <- fmt.Sprintf("H %s-%d", s.token, s.seq+1):
			s.seq++
			s.out = append(s.out, outBeat{seq: s.seq, sent: now})
			if follow.State(f.state.Load()) != follow.Resyncing {
				f.unconfirmed.CompareAndSwap(0, now.UnixNano())
			}
		default:
		}
		s.next = now.Add(f.c.heartbeat)
	}
	lag := f.lagAt(now)
	switch st := follow.State(f.state.Load()); {
	case st == follow.Following && lag > f.c.maxLag:
		f.feed.Invalidate()
		f.state.Store(int32(follow.Behind))
	case st == follow.Behind && lag < f.c.maxLag/2:
		s.grant()
		f.state.Store(int32(follow.Following))
	}
	s.watchRelay(now)
}

// grant makes the Loader ready until the max lag after s.asOf, when the
// last marker or heartbeat back was sent (a lease,
// [guarded.Feed.ReadyUntil]). Judged by when it was sent, a heartbeat that
// was out while this process was paused grants a lease that has run out
// already: the Loader passes through until one sent after the pause comes
// back. Stats judges Following by the same lease when it is read.
func (s *fsession[K]) grant() {
	until := s.asOf.Add(s.f.c.maxLag)
	s.f.feed.ReadyUntil(until)
	s.f.readyTill.Set(until)
}

// watchRelay logs once when the relay goes silent while this follower is
// behind (no message of the table's subject, whose every follower's
// heartbeats pass through it, for longer than the max lag: the relay or
// the broker stalls, where a follower that is only slow still gets
// messages), and once when messages come again.
func (s *fsession[K]) watchRelay(now time.Time) {
	f := s.f
	last := f.lastMsg.Load()
	silent := last != 0 && now.Sub(time.Unix(0, last)) > f.c.maxLag && follow.State(f.state.Load()) == follow.Behind
	switch {
	case silent && f.stalled.IsZero():
		f.stalled = time.Unix(0, last)
		f.c.logger.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: fanout follower hears nothing from the relay (the relay, or the broker, stalls); lookups pass through",
			slog.Duration("silent_for", now.Sub(f.stalled).Round(time.Millisecond)))
	case !silent && !f.stalled.IsZero() && now.Sub(time.Unix(0, last)) <= f.c.maxLag:
		f.c.logger.LogAttrs(context.Background(), slog.LevelInfo, "cuckooguard: fanout follower hears from the relay again",
			slog.Duration("silent_for", time.Unix(0, last).Sub(f.stalled).Round(time.Millisecond)))
		f.stalled = time.Time{}
	}
}
