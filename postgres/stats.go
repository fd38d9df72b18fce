package postgres

import (
	"time"

	"github.com/jackc/pglogrepl"
)

// FollowerStats describes a Follower.
type FollowerStats struct {
	State          State
	Applied        int64         // changes applied
	Skipped        int64         // this process's own inserts (and, with WithNotify, changes the last read saw)
	Resyncs        int64         // completed reads of the whole table: see FullReads for why
	Failures       int64         // sessions that ended in an error
	BackendPID     uint32        // of the stream's (or LISTEN) connection, 0 when not connected
	Lag            time.Duration // the last heartbeat's round trip, or how long nothing has confirmed the guard if longer (see below)
	Heartbeats     int64         // heartbeats sent
	HeartbeatsLost int64         // sessions given up because nothing came back within the deadline
	LastHeartbeat  time.Time     // when the last heartbeat came back
	CurrentAsOf    time.Time     // every change committed before it has been applied: when the last heartbeat (or marker) back was sent; zero before the first
	LastApplied    time.Time     // when the last change was applied
	RetryDelay     time.Duration // the wait before the last reconnect (see WithBackoff)

	// While the stream is silent because the server is still decoding WAL
	// before the table's next change (a bulk load), the follower waits for
	// it, behind, rather than reconnect: DecodingBehind is how many bytes
	// of WAL the server had yet to decode when last asked, BehindSince
	// when the wait began (zero when it does not wait), and BusyWaits how
	// many such waits there were.
	DecodingBehind int64
	BehindSince    time.Time
	BusyWaits      int64

	// LastError is the error of the last session that failed, and
	// LastErrorReason its Reason; FailuresByReason counts the failed
	// sessions by Reason (its values add up to Failures).
	LastError        error
	LastErrorReason  Reason
	FailuresByReason map[Reason]int64

	// FullReads counts the completed reads of the whole table by why they
	// were needed (its values add up to Resyncs). Through logical decoding
	// a lost connection resumes where it stopped, and a restart starts
	// from the snapshot file, so every read but the first says what went
	// wrong.
	FullReads map[ReadReason]int64

	// Logical decoding only.
	AppliedLSN    pglogrepl.LSN // the position in the stream the guard reflects
	ConfirmedLSN  pglogrepl.LSN // the position last confirmed to the server, which keeps the WAL after it
	SlotRetained  int64         // bytes of WAL the slot holds on the server, as last read (every 30 s)
	Snapshots     int64         // snapshot files written (WithSnapshotFile)
	LastSnapshot  time.Time     // when the last one was written
	SnapshotStart int64         // sessions that started from the snapshot file instead of a full read
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
	reads := make(map[ReadReason]int64, len(f.reads))
	for r, n := range f.reads {
		reads[r] = n
	}
	f.mu.Unlock()
	now := time.Now()
	st := FollowerStats{
		State:            f.stateAt(now),
		Applied:          f.applied.Load(),
		Skipped:          f.skipped.Load(),
		Resyncs:          f.resyncs.Load(),
		Failures:         f.failures.Load(),
		BackendPID:       f.pid.Load(),
		Lag:              f.lagAt(now),
		Heartbeats:       f.beats.Load(),
		HeartbeatsLost:   f.beatsLost.Load(),
		RetryDelay:       time.Duration(f.retryDelay.Load()),
		LastError:        lastErr,
		FailuresByReason: byReason,
		FullReads:        reads,
		AppliedLSN:       pglogrepl.LSN(f.appliedLSN.Load()),
		ConfirmedLSN:     pglogrepl.LSN(f.flushedLSN.Load()),
		SlotRetained:     f.retained.Load(),
		Snapshots:        f.snapshots.Load(),
		SnapshotStart:    f.restores.Load(),
		DecodingBehind:   f.decodingBehind.Load(),
		BusyWaits:        f.busyWaits.Load(),
	}
	if ns := f.behindSince.Load(); ns != 0 {
		st.BehindSince = time.Unix(0, ns)
	}
	if lastErr != nil {
		st.LastErrorReason = reasonOf(lastErr)
	}
	if ns := f.lastBeat.Load(); ns != 0 {
		st.LastHeartbeat = time.Unix(0, ns)
	}
	if ns := f.currentAsOf.Load(); ns != 0 {
		st.CurrentAsOf = time.Unix(0, ns)
	}
	if ns := f.lastApplied.Load(); ns != 0 {
		st.LastApplied = time.Unix(0, ns)
	}
	if ns := f.lastSnap.Load(); ns != 0 {
		st.LastSnapshot = time.Unix(0, ns)
	}
	return st
}
