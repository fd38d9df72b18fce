package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// TableIdentity is which table a name stands for, as one transaction sees
// it: the oid that the table's schema-qualified name resolves to, and the
// version of that table's publication (everything that decides what the
// change stream carries of it). A rename swap, a DROP and CREATE, and a
// change of the publication each give the name another identity; an
// identity never comes back to an earlier one (the version names catalog
// rows by oid and transaction id).
//
// A [Source]'s stream of a table has the identity its session resolved
// ([SourceStart.Identities]); a relayed follower's marker or heartbeat
// sent through a [ControlEmitter] carries the identity its own
// transaction saw ([SourceControl.Table]). The two are equal only while
// the stream is of the table the application queries by name.
type TableIdentity struct {
	OID     uint32 // 0: the name resolves to no table
	Version string // "": the table has no publication
}

// IsZero reports whether i identifies nothing: a control message of a
// follower that does not send its table's identity.
func (i TableIdentity) IsZero() bool { return i.OID == 0 && i.Version == "" }

// String returns i as "<oid> <version>", with "-" for a missing part: the
// form the control messages and the relay's messages carry.
func (i TableIdentity) String() string {
	oid, v := "-", "-"
	if i.OID != 0 {
		oid = strconv.FormatUint(uint64(i.OID), 10)
	}
	if i.Version != "" {
		v = i.Version
	}
	return oid + " " + v
}

// parseTableIdentity is the inverse of TableIdentity.String.
func parseTableIdentity(s string) (TableIdentity, error) {
	oidText, v, ok := strings.Cut(s, " ")
	if !ok || v == "" {
		return TableIdentity{}, fmt.Errorf("postgres: %q is not a table identity", s)
	}
	var i TableIdentity
	if oidText != "-" {
		o, err := strconv.ParseUint(oidText, 10, 32)
		if err != nil || o == 0 {
			return TableIdentity{}, fmt.Errorf("postgres: %q is not a table identity", s)
		}
		i.OID = uint32(o)
	}
	if v != "-" {
		i.Version = v
	}
	return i, nil
}

// identitySep separates a control message's payload from the identity
// appended to it: neither the followers' payloads nor an identity holds a
// tab.
const identitySep = "\t"

// splitIdentity splits a relayed control message into the follower's
// payload and the identity its transaction saw (zero if it carries none:
// a follower of an earlier version).
func splitIdentity(message string) (payload string, id TableIdentity) {
	payload, rest, ok := strings.Cut(message, identitySep)
	if !ok {
		return message, TableIdentity{}
	}
	id, err := parseTableIdentity(rest)
	if err != nil {
		return payload, TableIdentity{}
	}
	return payload, id
}

// A ControlEmitter sends a relayed follower's markers and heartbeats
// through the database (logical decoding messages of [ControlPrefix]),
// each with the identity of the follower's table as the message's own
// transaction sees it (see [TableIdentity]): a [Source] hands that on as
// [SourceControl.Table], so that what comes back proves, as of the
// message's commit, that the relay streams the table the name names.
//
// A ControlEmitter is safe for concurrent use by multiple goroutines.
type ControlEmitter struct {
	table string // "schema.table"
	query string
	ident string // the table's name as the follower was given it, quoted as SQL takes it
	pub   string // the name of its publication
}

// NewControlEmitter resolves table through conn (its search_path), as
// [Resolve] does, and returns an emitter of control messages for it:
// [ControlEmitter.Table] is the table as Resolve names it. Each message
// resolves table again as the application would, through the search_path
// of the connection it is sent on: a table of the name made in a schema
// before the table's on the search_path is another table too.
func NewControlEmitter(ctx context.Context, conn Conn, table string) (*ControlEmitter, error) {
	if ctx == nil || noConn(conn) {
		return nil, errors.New("postgres: NewControlEmitter needs a context and a connection")
	}
	r, err := resolve(ctx, conn, table)
	if err != nil {
		return nil, err
	}
	return &ControlEmitter{table: r.String(), ident: sanitizeTable(table), pub: publicationName(r.schema, r.name),
		query: `SELECT pg_logical_emit_message(true, $1, $2 || '` + identitySep + `' || ` + identityExpr(3, 4) + `)`}, nil
}

// Table returns the emitter's table as "schema.table": the form of
// [SourceStart.Tables].
func (e *ControlEmitter) Table() string { return e.table }

// Emit sends payload, a marker or heartbeat without a tab, as a control
// message of route ([ControlPrefix]) through conn, in a transaction of its
// own, with the table's identity as that transaction sees it.
func (e *ControlEmitter) Emit(ctx context.Context, conn Conn, route, payload string) error {
	if strings.Contains(payload, identitySep) {
		return fmt.Errorf("postgres: a control payload holds no tab: %q", payload)
	}
	if _, err := conn.Exec(ctx, e.query, ControlPrefix(route), payload, e.ident, e.pub); err != nil {
		return fmt.Errorf("postgres: send a control message: %w", err)
	}
	return nil
}
