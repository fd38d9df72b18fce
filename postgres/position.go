package postgres

import (
	"time"

	"github.com/jackc/pglogrepl"
)

// slotID names one replication slot instance: a slot of a name made again
// (by a full read, by another process with the same origin, by an
// operator) is another instance, whose positions say nothing about this
// one's, and so is a slot of the same name in another cluster.
type slotID struct {
	system   string        // the cluster's system identifier (IDENTIFY_SYSTEM)
	database string        // the database the slot decodes
	name     string        // the slot's name
	created  pglogrepl.LSN // its consistent point when it was made: where its stream began
}

// position is where a logical-decoding Follower stands in the change
// stream: what its guard reflects, and what it may let the server forget.
// It is touched by Run's goroutine only.
//
// The one rule: the server may discard WAL only up to what survives this
// process. With a snapshot file that is the position of the file written
// for this slot instance (a restart streams from there); without one, or
// while there is no such file, the position applied (a restart reads the
// table anyway). A file of another instance is removed before the
// instance is made (see readAll), so the file on disk, if any, is this
// slot's and the slot never confirms past it.
type position struct {
	slot       slotID        // the slot instance of the positions; zero before the first start
	valid      bool          // the guard reflects exactly the changes up to applied
	applied    pglogrepl.LSN // the end of the last transaction applied (or passed by, with nothing of the table in it)
	durable    pglogrepl.LSN // the position of this slot's snapshot file; 0 if it has none
	pubVersion string        // the publication under which the applied changes were decoded (publicationVersion)
	saved      time.Time     // when the file was last written, or the position last made valid
}

// started records that the guard reflects exactly the changes up to at,
// in slot (a read of the table under its snapshot, or a saved guard of it
// with the file at durable), decoded under publication version pub.
func (p *position) started(slot slotID, at, durable pglogrepl.LSN, pub string, now time.Time) {
	*p = position{slot: slot, valid: true, applied: at, durable: durable, pubVersion: pub, saved: now}
}

// advance records that the guard reflects the changes up to lsn.
func (p *position) advance(lsn pglogrepl.LSN) {
	p.applied = max(p.applied, lsn)
}

// confirmable returns the position the server may discard the WAL
// before: see position. keepsFile says whether the Follower keeps a
// snapshot file. It is never below the slot's own start, so that it
// never names a position from before the slot existed.
func (p *position) confirmable(keepsFile bool) pglogrepl.LSN {
	if keepsFile && p.durable != 0 {
		return max(p.durable, p.slot.created)
	}
	return max(p.applied, p.slot.created)
}

// needsSave reports whether a snapshot file should be written now, every
// interval: the guard reflects a position the file does not have.
func (p *position) needsSave(now time.Time, interval time.Duration) bool {
	return p.valid && p.applied > p.durable && (p.saved.IsZero() || now.Sub(p.saved) >= interval)
}
