package postgres

import "time"

// FollowerStats describes a Follower.
type FollowerStats struct {
	State          State
	Applied        int64         // notifications applied
	Skipped        int64         // notifications of own inserts, or seen by the last read
	Resyncs        int64         // completed reads of the whole table
	Failures       int64         // sessions that ended in an error
	BackendPID     uint32        // of the LISTEN connection, 0 when not connected
	Lag            time.Duration // the last heartbeat's round trip, or the age of the oldest one out if larger
	Heartbeats     int64         // heartbeats sent
	HeartbeatsLost int64         // sessions given up because nothing came back within the deadline
	LastHeartbeat  time.Time     // when the last heartbeat came back
	LastApplied    time.Time     // when the last notification was applied
	LastError      error
}

// Stats returns the Follower's statistics.
func (f *Follower[K]) Stats() FollowerStats {
	f.mu.Lock()
	lastErr := f.lastErr
	f.mu.Unlock()
	st := FollowerStats{
		State:          State(f.state.Load()),
		Applied:        f.applied.Load(),
		Skipped:        f.skipped.Load(),
		Resyncs:        f.resyncs.Load(),
		Failures:       f.failures.Load(),
		BackendPID:     f.pid.Load(),
		Lag:            time.Duration(f.lag.Load()),
		Heartbeats:     f.beats.Load(),
		HeartbeatsLost: f.beatsLost.Load(),
		LastError:      lastErr,
	}
	if ns := f.lastBeat.Load(); ns != 0 {
		st.LastHeartbeat = time.Unix(0, ns)
	}
	if ns := f.lastApplied.Load(); ns != 0 {
		st.LastApplied = time.Unix(0, ns)
	}
	return st
}
