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
	Lag            time.Duration // the last heartbeat's round trip, or how long nothing has confirmed the guard if longer (see below)
	Heartbeats     int64         // heartbeats sent
	HeartbeatsLost int64         // sessions given up because nothing came back within the deadline
	LastHeartbeat  time.Time     // when the last heartbeat came back
	LastApplied    time.Time     // when the last notification was applied
	RetryDelay     time.Duration // the wait before the last reconnect (see WithBackoff)

	// LastError is the error of the last session that failed, and
	// LastErrorReason its Reason; FailuresByReason counts the failed
	// sessions by Reason (its values add up to Failures).
	LastError        error
	LastErrorReason  Reason
	FailuresByReason map[Reason]int64
}

// Stats returns the Follower's statistics. Its values are read one by one
// and do not necessarily form a consistent snapshot.
//
// Lag is read at the moment Stats is called: while no heartbeat comes
// back (a silent connection, a lost one, a session reconnecting or
// reading the table) it grows with the age of the oldest heartbeat out,
// or with the time since the last session ended.
func (f *Follower[K]) Stats() FollowerStats {
	f.mu.Lock()
	lastErr := f.lastErr
	byReason := make(map[Reason]int64, len(f.byReason))
	for r, n := range f.byReason {
		byReason[r] = n
	}
	f.mu.Unlock()
	st := FollowerStats{
		State:            State(f.state.Load()),
		Applied:          f.applied.Load(),
		Skipped:          f.skipped.Load(),
		Resyncs:          f.resyncs.Load(),
		Failures:         f.failures.Load(),
		BackendPID:       f.pid.Load(),
		Lag:              f.lagAt(time.Now()),
		Heartbeats:       f.beats.Load(),
		HeartbeatsLost:   f.beatsLost.Load(),
		RetryDelay:       time.Duration(f.retryDelay.Load()),
		LastError:        lastErr,
		FailuresByReason: byReason,
	}
	if lastErr != nil {
		st.LastErrorReason = reasonOf(lastErr)
	}
	if ns := f.lastBeat.Load(); ns != 0 {
		st.LastHeartbeat = time.Unix(0, ns)
	}
	if ns := f.lastApplied.Load(); ns != 0 {
		st.LastApplied = time.Unix(0, ns)
	}
	return st
}
