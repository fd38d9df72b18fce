package mysql

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/internal/options"
)

// The tables a relay keeps in the DSN's database, made at its first
// session if they are missing.
const (
	// controlTable carries the markers and heartbeats of relayed
	// followers (follow.Session.Emit) and of the relay's own Source, one
	// row per sender, through the binlog.
	controlTable = "cuckooguard_control"
	// relayTable keeps each relay's place in the binlog and its lease's
	// terms, a row per relay name.
	relayTable = "cuckooguard_relay"
)

// staleControl is how long a control row may go without an update before
// a relay's Source deletes it (a follower that stopped without Close).
const staleControl = time.Hour

// Relayed returns the MariaDB database at dsn as the fanout module relays
// it: one relay per database reads the binlog once for all its tables and
// publishes their changes to NATS JetStream; replicas follow the stream
// rather than the binlog. dsn is a DSN as for [NewFollower]
// (user:password@tcp(host:port)/dbname); the tables are in dbname. Of the
// options, [WithServerID] (the relay's binlog stream's id; random by
// default) and [WithTagTable] apply. See the package doc's "Behind a
// relay" for the server's settings and the user's privileges.
//
//	db, err := mysql.Relayed(dsn)
//	relay, err := fanout.NewRelay(db, "users-api", nc, []follow.Table{{Table: "users", Key: "id"}})
//	follower, err := fanout.NewFollower(loader, nc, db, "users", "id", parse, fanout.WithRelay("users-api"))
func Relayed(dsn string, opts ...Option) (follow.Database, error) {
	c := config{tagTable: DefaultTagTable}
	if err := options.Apply("mysql: Relayed", &c, opts); err != nil {
		return nil, err
	}
	if !validName.MatchString(c.tagTable) {
		return nil, fmt.Errorf("mysql: Relayed: tag table %q must be a plain name (letters, digits, _ and $)", c.tagTable)
	}
	srv, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	return &relayed{srv: srv, serverID: c.serverID, tagTable: c.tagTable, weights: map[string]*weights{}}, nil
}

// relayed is a database as the fanout module relays it.
type relayed struct {
	srv      server
	serverID uint32 // the Source's binlog stream's; 0: random per Source
	tagTable string

	mu      sync.Mutex          // protects weights
	weights map[string]*weights // by collation, as read from the server
}

func (d *relayed) Permanent(err error) bool {
	return errors.Is(err, ErrSetup) || errors.Is(err, ErrKeyType)
}

// TagStatement returns one statement that writes a tag of content in the
// writing transaction: a compound statement that inserts a row of the
// tag table and deletes it again, so that the binlog carries the
// inserted row with the transaction's other rows and the table keeps
// none. A compound statement takes no parameters: the row's id and the
// content are in its text (the content as a hex literal), and it has no
// arguments. It needs INSERT and DELETE on the tag table.
func (d *relayed) TagStatement(content []byte) (string, []any) {
	id := rand.Int64N(1<<62) + 1
	q := fmt.Sprintf("BEGIN NOT ATOMIC INSERT INTO `%s` (id, tag) VALUES (%d, X'%x'); DELETE FROM `%s` WHERE id = %d; END",
		d.tagTable, id, content, d.tagTable, id)
	return q, nil
}

// form returns the key form of col, reading a collation's weights from
// the server through c once per collation.
func (d *relayed) form(c *client.Conn, col column) (*keyForm, error) {
	return formOf(col, func(collation string) (*weights, error) {
		d.mu.Lock()
		w := d.weights[collation]
		d.mu.Unlock()
		if w != nil {
			return w, nil
		}
		w, err := loadWeights(c, collation)
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		d.weights[collation] = w
		d.mu.Unlock()
		return w, nil
	})
}

// column describes table's key column and checks that it can be followed.
func (d *relayed) column(c *client.Conn, table, key string) (column, *keyForm, error) {
	col, err := describe(c, d.srv.db, table, key)
	if err != nil {
		return column{}, nil, err
	}
	if err := col.followable(table); err != nil {
		return column{}, nil, err
	}
	form, err := d.form(c, col)
	return col, form, err
}

func (d *relayed) KeyColumn(table, key string, deadline time.Duration) (follow.KeyColumn, error) {
	switch {
	case table == "" || key == "" || deadline <= 0:
		return nil, errors.New("mysql: KeyColumn needs a table, a key column and a deadline")
	case !validName.MatchString(table) || !validName.MatchString(key):
		return nil, fmt.Errorf("mysql: table %q and key column %q must be plain names (letters, digits, _ and $) of the DSN's database", table, key)
	}
	return &keyColumn{d: d, table: table, key: key, deadline: deadline}, nil
}

// keyColumn is where a relayed follower reads its key column's form.
type keyColumn struct {
	d          *relayed
	table, key string
	deadline   time.Duration
}

func (k *keyColumn) Composite() bool { return false }

// readFormTimeout bounds the queries that read a key column's form through
// a connection of their own, beyond the deadline of connecting: a
// collation's weights are 64Ki rows (UCA's, all of Unicode's).
const readFormTimeout = 10 * time.Second

func (k *keyColumn) Read() (follow.KeyForm, error) {
	ctx, cancel := context.WithTimeout(context.Background(), k.deadline+readFormTimeout)
	defer cancel()
	c, closeConn, err := dial(ctx, k.d.srv, k.deadline)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	_ = c.SetDeadline(time.Now().Add(k.deadline + readFormTimeout))
	col, form, err := k.d.column(c, k.table, k.key)
	if err != nil {
		return nil, err
	}
	return relayForm{form, col}, nil
}

// relayForm is a key column's form as package follow takes it.
type relayForm struct {
	k   *keyForm
	col column
}

func (f relayForm) Key(text string) (string, error) { return f.k.canon(text) }
func (f relayForm) Trivial() bool                   { return f.k.kind == formBytes }
func (f relayForm) Type() string                    { return f.col.columnType + collationSays(f.col) }

func (d *relayed) Teardown(ctx context.Context, name string, tables []string) (follow.Origin, error) {
	if ctx == nil || name == "" {
		return follow.Origin{}, errors.New("mysql: Teardown needs a context and the relay's name")
	}
	c, closeConn, err := dial(ctx, d.srv, teardownWait)
	if err != nil {
		return follow.Origin{}, err
	}
	defer closeConn()
	o, err := readOrigin(c, d.srv.db)
	if err != nil {
		return follow.Origin{}, err
	}
	for _, q := range []struct{ query, arg string }{
		{"DELETE FROM `" + relayTable + "` WHERE name = ?", name},
		{"DELETE FROM `" + controlTable + "` WHERE route = ?", sourceRoute(name)},
	} {
		if _, err := c.Execute(q.query, q.arg); err != nil && !missingTable(err) {
			return follow.Origin{}, fmt.Errorf("mysql: teardown: %w", privilege(err))
		}
	}
	return o, nil
}

// teardownWait bounds Teardown's connection's handshake.
const teardownWait = 10 * time.Second

// missingTable reports whether err is the server's "no such table".
func missingTable(err error) bool {
	var me *gomysql.MyError
	return errors.As(err, &me) && me.Code == gomysql.ER_NO_SUCH_TABLE
}

// sourceRoute is the route of the heartbeats of the Source of relay name:
// what its control rows say, and what it passes on to no one.
func sourceRoute(name string) string { return "cuckooguard source " + name }

// keyColumnOf returns where a follower of table, on the server srv, reads
// its key column's form through connections of its own.
func keyColumnOf(srv server, table, key string, deadline time.Duration) follow.KeyColumn {
	return &keyColumn{d: &relayed{srv: srv, weights: make(map[string]*weights)}, table: table, key: key, deadline: deadline}
}
