package postgres

import "time"

// wake returns when the session must look at its heartbeats next: the
// next heartbeat is due, or the moment the oldest one out makes the lag
// exceed the max lag, or the deadline runs out. Waking at the moment
// rather than at the next heartbeat tick is what bounds the time from a
// silent fault to pass-through by the heartbeat plus the max lag (the
// deadline, with the defaults), not that and one more heartbeat.
func (f *Follower[K]) wake(hb *heartbeats, next time.Time) time.Time {
	const past = time.Millisecond // the checks compare with >: be past the moment
	w := next
	if len(hb.out) > 0 {
		if State(f.state.Load()) == Following {
			w = earliest(w, hb.out[0].sent.Add(f.maxLag+past))
		}
		w = earliest(w, hb.last.Add(f.deadline+past))
	}
	if State(f.state.Load()) == Resyncing {
		w = earliest(w, hb.markerSent.Add(f.deadline+past))
	}
	return w
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// heartbeats is what a session knows of its heartbeats.
type heartbeats struct {
	session    string        // this session's token: heartbeats are "H <session>-<seq>"
	seq        int64         // of the last heartbeat sent
	out        []beat        // sent and not back yet, oldest first
	rtt        time.Duration // of the last one back
	last       time.Time     // when the last notification of any kind arrived
	markerSent time.Time
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
			hb.out = hb.out[i+1:] // notifications arrive in order: older ones are lost or late
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
func (f *Follower[K]) checkLag(now time.Time) {
	lag := f.lagAt(now)
	switch st := State(f.state.Load()); {
	case st == Following && lag > f.maxLag:
		// Too late to trust: other replicas' rows may be missing for
		// longer than promised. Pass through until caught up.
		f.feed.Invalidate()
		f.state.Store(int32(Behind))
	case st == Behind && lag < f.maxLag/2:
		f.feed.MarkReady()
		f.state.Store(int32(Following))
	}
}
