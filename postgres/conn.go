package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// dialer opens the connections of a Follower or a Source.
type dialer struct {
	conf    *pgx.ConnConfig // parsed dsn; each connection copies it
	who     string          // "follower" or "relay", in application_name
	origin  string          // the process's name among its peers, in application_name; may be ""
	timeout time.Duration   // the heartbeat deadline: connecting takes no longer
}

// connect opens a regular connection for role, within the deadline: a
// database that does not answer is a failure like any other.
func (d *dialer) connect(ctx context.Context, role string) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	conf := d.conf.Copy()
	d.name(conf.RuntimeParams, role)
	// No prepared statements: through a pooler (PgBouncer), one server
	// connection serves many clients, whose cached statements collide
	// ("prepared statement stmtcache_… already exists"). The few
	// statements here gain nothing from preparing. It also makes every
	// result text, printed by the type's output function, as the change
	// stream prints keys (see scan).
	conf.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	// The settings that shape printed keys are set in the transactions
	// that read keys (pinLocal), not here: a pooler refuses startup
	// parameters it does not know ("unsupported startup parameter:
	// bytea_output"), and a connection that fails to start cannot even
	// tell that the pooler delivers no notifications.
	c, err := pgx.ConnectConfig(cctx, conf)
	if err != nil {
		return nil, failed(ReasonConnect, fmt.Errorf("postgres: %s connect: %w", d.who, err))
	}
	return c, nil
}

// connectStream opens the replication connection, within the deadline.
func (d *dialer) connectStream(ctx context.Context) (*pgconn.PgConn, error) {
	cctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	conf := d.conf.Config.Copy()
	conf.RuntimeParams["replication"] = "database"
	d.name(conf.RuntimeParams, "stream")
	pinOutput(conf.RuntimeParams)
	c, err := pgconn.ConnectConfig(cctx, conf)
	if err != nil {
		return nil, failed(ReasonConnect, fmt.Errorf("postgres: %s connect for streaming: %w", d.who, err))
	}
	return c, nil
}

// name sets the application_name that pg_stat_activity shows for a
// connection of role, unless the DSN sets one.
func (d *dialer) name(params map[string]string, role string) {
	if params["application_name"] == "" {
		name := "cuckooguard " + d.who + " " + role
		if d.origin != "" {
			name += " " + d.origin
		}
		params["application_name"] = name // PostgreSQL truncates it to 63 bytes
	}
}

// outputPins are the settings that shape how the server prints values:
// the read and the stream print keys with the type's output function, and
// must print them alike whatever the server, database or role defaults
// are (a timestamp key in another DateStyle or TimeZone would be another
// key).
var outputPins = [...][2]string{{"DateStyle", "ISO, MDY"}, {"IntervalStyle", "postgres"}, {"TimeZone", "UTC"},
	{"extra_float_digits", "1"}, {"bytea_output", "hex"}}

// pinned reports whether the startup parameters params set k (a DSN that
// sets one keeps it, for the read and the stream alike).
func pinned(params map[string]string, k string) bool {
	_, ok := param(params, k)
	return ok
}

// pinOutput sets outputPins in the startup parameters of a replication
// connection, unless params sets them already. (A replication connection
// goes to the server itself: no pooler carries one.)
func pinOutput(params map[string]string) {
	for _, kv := range outputPins {
		if !pinned(params, kv[0]) {
			params[kv[0]] = kv[1]
		}
	}
}

// pinLocal sets outputPins for the rest of tx, a transaction that reads
// keys on a regular connection, except those its startup parameters
// params set: what pinOutput gives the stream's connection.
func pinLocal(ctx context.Context, tx pgx.Tx, params map[string]string) error {
	var sets []string
	for _, kv := range outputPins {
		if !pinned(params, kv[0]) {
			sets = append(sets, fmt.Sprintf("set_config(%s, %s, true)", quoteLiteral(kv[0]), quoteLiteral(kv[1])))
		}
	}
	if len(sets) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, "SELECT "+strings.Join(sets, ", "), pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("postgres: pin the output settings: %w", err)
	}
	return nil
}
