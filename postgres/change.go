package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/internal/tagrec"
)

// Op is the kind of a change.
type Op byte

// The operations a notification carries.
const (
	Insert    Op = 'I' // Key was inserted
	Delete    Op = 'D' // Key was deleted
	Update    Op = 'U' // OldKey became Key
	Resync    Op = 'R' // a key too long for a payload changed: read the table again
	Marker    Op = 'S' // a follower's own marker: every change committed before it has arrived
	Heartbeat Op = 'H' // a follower's heartbeat: the LISTEN connection is alive
)

// Change is one decoded notification.
type Change struct {
	Op     Op
	TxID   uint64 // the writing transaction, as txid_current() saw it
	Seq    int64  // unique per notification
	At     int64  // when the row changed, in microseconds since 1970 (database clock)
	Origin string // the tags of its transaction (Follower.Tag, with WithNotify): keys and who added them; "" if untagged
	Key    string // the key as PostgreSQL prints it (::text)
	OldKey string // for Update: the key before
}

// ParseChange decodes a payload written by the trigger of [Install]:
// "<op> <txid> <seq> <micros> <len>:<origin> " and then "<len>:<key>" for I and D,
// "<len>:<old> <len>:<new>" for U, or "resync" for R.
func ParseChange(payload string) (Change, error) {
	bad := func(why string) (Change, error) {
		return Change{}, fmt.Errorf("%w: %s: %.60q", ErrPayload, why, payload)
	}
	if len(payload) < 2 || payload[1] != ' ' {
		return bad("no operation")
	}
	c := Change{Op: Op(payload[0])}
	rest := payload[2:]
	if c.Op == Marker || c.Op == Heartbeat { // "S <token>" or "H <token>", sent by a Follower, not the trigger
		if rest == "" {
			return bad("marker")
		}
		c.Key = rest
		return c, nil
	}
	field, rest, _ := strings.Cut(rest, " ")
	var err error
	if c.TxID, err = strconv.ParseUint(field, 10, 64); err != nil {
		return bad("transaction id")
	}
	field, rest, _ = strings.Cut(rest, " ")
	if c.Seq, err = strconv.ParseInt(field, 10, 64); err != nil {
		return bad("sequence number")
	}
	field, rest, _ = strings.Cut(rest, " ")
	if c.At, err = strconv.ParseInt(field, 10, 64); err != nil {
		return bad("timestamp")
	}
	origin, rest, ok := tagrec.CutField(rest)
	if !ok || !strings.HasPrefix(rest, " ") {
		return bad("origin")
	}
	c.Origin, rest = origin, rest[1:]
	switch c.Op {
	case Resync:
		if rest != "resync" {
			return bad("resync")
		}
		return c, nil
	case Insert, Delete:
		k, tail, ok := tagrec.CutField(rest)
		if !ok || tail != "" {
			return bad("key")
		}
		c.Key = k
	case Update:
		old, tail, ok := tagrec.CutField(rest)
		if !ok || !strings.HasPrefix(tail, " ") {
			return bad("old key")
		}
		k, tail, ok := tagrec.CutField(tail[1:])
		if !ok || tail != "" {
			return bad("new key")
		}
		c.OldKey, c.Key = old, k
	default:
		return bad("unknown operation")
	}
	return c, nil
}

// Snapshot is a PostgreSQL transaction snapshot (pg_current_snapshot()):
// which transactions had committed when it was taken.
type Snapshot struct {
	Xmin, Xmax uint64
	Xip        []uint64 // in progress when taken, sorted
}

// ParseSnapshot decodes the text form "xmin:xmax:xip,xip,...".
func ParseSnapshot(s string) (Snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("postgres: snapshot %q: want xmin:xmax:xip", s)
	}
	var sn Snapshot
	var err error
	if sn.Xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("postgres: snapshot %q: %w", s, err)
	}
	if sn.Xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("postgres: snapshot %q: %w", s, err)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return Snapshot{}, fmt.Errorf("postgres: snapshot %q: %w", s, err)
			}
			sn.Xip = append(sn.Xip, v)
		}
	}
	slices.Sort(sn.Xip)
	if sn.Xmin > sn.Xmax {
		return Snapshot{}, fmt.Errorf("postgres: snapshot %q: xmin above xmax", s)
	}
	return sn, nil
}

// Visible reports whether transaction txid had committed when the snapshot
// was taken, so that a read under the snapshot saw its writes (for a
// committed txid, as every notified one is).
func (s Snapshot) Visible(txid uint64) bool {
	if txid < s.Xmin {
		return true
	}
	if txid >= s.Xmax {
		return false
	}
	_, inProgress := slices.BinarySearch(s.Xip, txid)
	return !inProgress
}

// VisibleXid is Visible for a transaction id of 32 bits, as logical
// decoding carries it (pgoutput's Begin): it is taken as the one of the
// 64-bit ids within 2^31 of the snapshot's xmax, where every transaction a
// stream carries after the snapshot was taken lies.
func (s Snapshot) VisibleXid(xid uint32) bool {
	full := int64(s.Xmax) + int64(int32(xid-uint32(s.Xmax)))
	if full < 0 {
		return true
	}
	return s.Visible(uint64(full))
}

// ReadSnapshot starts a REPEATABLE READ transaction on conn and returns it
// with its snapshot: every query in tx sees exactly the transactions that
// the snapshot says are visible. The caller reads the keys in tx and then
// commits or rolls it back.
func ReadSnapshot(ctx context.Context, conn *pgx.Conn) (pgx.Tx, Snapshot, error) {
	switch {
	case ctx == nil:
		return nil, Snapshot{}, errors.New("postgres: ReadSnapshot: ctx is nil")
	case conn == nil:
		return nil, Snapshot{}, errors.New("postgres: ReadSnapshot: conn is nil")
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, Snapshot{}, fmt.Errorf("postgres: begin snapshot: %w", err)
	}
	// The first statement of a REPEATABLE READ transaction fixes its
	// snapshot, so this is the snapshot of every later query in tx.
	var text string
	if err := tx.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&text); err != nil {
		tx.Rollback(ctx)
		return nil, Snapshot{}, fmt.Errorf("postgres: read snapshot: %w", err)
	}
	sn, err := ParseSnapshot(text)
	if err != nil {
		tx.Rollback(ctx)
		return nil, Snapshot{}, err
	}
	return tx, sn, nil
}
