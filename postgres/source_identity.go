package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cuckooguard/cuckooguard/follow"
)

// identitySep separates a control message's payload from the identity
// appended to it: neither the followers' payloads nor an identity holds a
// tab.
const identitySep = "\t"

// splitIdentity splits a relayed control message into the follower's
// payload and the identity its transaction saw (zero if it carries none:
// a follower of an earlier version).
func splitIdentity(message string) (payload string, id follow.TableIdentity) {
	payload, rest, ok := strings.Cut(message, identitySep)
	if !ok {
		return message, follow.TableIdentity{}
	}
	id, err := follow.ParseTableIdentity(rest)
	if err != nil {
		return payload, follow.TableIdentity{}
	}
	return payload, id
}

// A controlEmitter sends a relayed follower's markers and heartbeats
// through the database (logical decoding messages of [controlPrefixOf]),
// each with the identity of the follower's table as the message's own
// transaction sees it (see [follow.TableIdentity]): a [Source] hands that on as
// [follow.Control.Table], so that what comes back proves, as of the
// message's commit, that the relay streams the table the name names.
//
// A controlEmitter is safe for concurrent use by multiple goroutines.
type controlEmitter struct {
	table string // "schema.table"
	query string
	ident string // the table's name as the follower was given it, quoted as SQL takes it
	pub   string // the name of its publication
}

// newControlEmitter resolves table through conn (its search_path), as
// [Resolve] does, and returns an emitter of control messages for it:
// [controlEmitter.Table] is the table as Resolve names it. Each message
// resolves table again as the application would, through the search_path
// of the connection it is sent on: a table of the name made in a schema
// before the table's on the search_path is another table too.
func newControlEmitter(ctx context.Context, conn Conn, table string) (*controlEmitter, error) {
	if ctx == nil || noConn(conn) {
		return nil, errors.New("postgres: newControlEmitter needs a context and a connection")
	}
	r, err := resolve(ctx, conn, table)
	if err != nil {
		return nil, err
	}
	return &controlEmitter{table: r.String(), ident: sanitizeTable(table), pub: publicationName(r.schema, r.name),
		query: `SELECT pg_logical_emit_message(true, $1, $2 || '` + identitySep + `' || ` + identityExpr(3, 4) + `)`}, nil
}

// Table returns the emitter's table as "schema.table": the form of
// [follow.Start.Tables].
func (e *controlEmitter) Table() string { return e.table }

// Emit sends payload, a marker or heartbeat without a tab, as a control
// message of route ([controlPrefixOf]) through conn, in a transaction of its
// own, with the table's identity as that transaction sees it.
func (e *controlEmitter) Emit(ctx context.Context, conn Conn, route, payload string) error {
	if strings.Contains(payload, identitySep) {
		return fmt.Errorf("postgres: a control payload holds no tab: %q", payload)
	}
	if _, err := conn.Exec(ctx, e.query, controlPrefixOf(route), payload, e.ident, e.pub); err != nil {
		return fmt.Errorf("postgres: send a control message: %w", err)
	}
	return nil
}
