package mysql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// checkServer returns an error wrapping ErrSetup, saying what to change,
// if the server's binlog cannot show the table's changes.
func checkServer(c *client.Conn) error {
	r, err := c.Execute("SELECT @@GLOBAL.log_bin, @@GLOBAL.binlog_format, @@GLOBAL.binlog_row_image")
	if err != nil {
		return fmt.Errorf("mysql: read the server's binlog settings: %w", err)
	}
	logBin, _ := r.GetString(0, 0)
	format, _ := r.GetString(0, 1)
	image, _ := r.GetString(0, 2)
	switch {
	case logBin != "1":
		return fmt.Errorf("%w: the binary log is off: start the server with --log-bin (and --binlog-format=ROW)", ErrSetup)
	case !strings.EqualFold(format, "ROW"):
		return fmt.Errorf("%w: binlog_format is %s, the binlog must carry rows: SET GLOBAL binlog_format = 'ROW' and set binlog_format=ROW in the server's configuration (sessions open before keep theirs)", ErrSetup, format)
	case !strings.EqualFold(image, "FULL"):
		return fmt.Errorf("%w: binlog_row_image is %s, an update must carry the key before and after: SET GLOBAL binlog_row_image = 'FULL' and in the server's configuration", ErrSetup, image)
	}
	return nil
}

// useForm makes the key column's form for col, reading a collation's
// weights from the server once per collation, and installs its key rule
// in the Loader when it changed.
func (f *Follower[K]) useForm(read *client.Conn, col column) error {
	if f.form != nil && f.formCol.same(col) {
		return nil
	}
	form, err := formOf(col, func(collation string) (*weights, error) {
		if w := f.weights[collation]; w != nil {
			return w, nil
		}
		w, err := loadWeights(read, collation)
		if err != nil {
			return nil, err
		}
		f.weights[collation] = w
		return w, nil
	})
	if err != nil {
		return err
	}
	f.form, f.formCol = form, col
	f.tags.SetForm(relayForm{form, col})
	f.feed.SetKeyRule(func(k K) (K, error) {
		text, err := form.canon(f.text(k))
		if err != nil {
			var zero K
			return zero, err
		}
		return f.parse(text)
	})
	return nil
}

// heartbeatTable creates the heartbeat table if missing and returns the
// position of its beat column. It writes no DDL when the table exists:
// every follower's stream carries the statement, and one whose table's
// name is in its text would read its table again.
func (f *Follower[K]) heartbeatTable(c *client.Conn) (int, error) {
	col, err := describe(c, f.srv.db, f.hbTable, "beat")
	if errors.Is(err, ErrSetup) {
		if _, err := c.Execute("CREATE TABLE IF NOT EXISTS `" + f.hbTable + "` (id INT UNSIGNED NOT NULL PRIMARY KEY, beat VARCHAR(100) NOT NULL) ENGINE=InnoDB"); err != nil {
			return 0, fmt.Errorf("mysql: create the heartbeat table %s: %w", f.hbTable, privilege(err))
		}
		col, err = describe(c, f.srv.db, f.hbTable, "beat")
	}
	if err != nil {
		return 0, err
	}
	if !strings.EqualFold(col.engine, "InnoDB") {
		return 0, fmt.Errorf("%w: the heartbeat table %s must be InnoDB", ErrSetup, f.hbTable)
	}
	return col.ordinal, nil
}

// tagTableOrdinal creates the tag table if missing and its user may, and
// returns the position of its tag column; -1 if there is no tag table
// (tags are then not read: each insert through the Loader costs a copy).
// As with the heartbeat table, it writes no DDL when the table exists.
func (f *Follower[K]) tagTableOrdinal(c *client.Conn) (int, error) {
	col, err := describe(c, f.srv.db, f.tagTable, "tag")
	if errors.Is(err, ErrSetup) {
		if _, err := c.Execute("CREATE TABLE IF NOT EXISTS `" + f.tagTable + "` (id BIGINT NOT NULL PRIMARY KEY, tag MEDIUMBLOB NOT NULL) ENGINE=InnoDB"); err != nil {
			if !f.tagSaid {
				f.tagSaid = true
				f.log.LogAttrs(context.Background(), slog.LevelWarn, "cuckooguard: follower cannot create the tag table; Follower.Tag fails until it exists",
					slog.String("tag_table", f.tagTable), slog.Any("error", privilege(err)))
			}
			return -1, nil
		}
		col, err = describe(c, f.srv.db, f.tagTable, "tag")
	}
	if err != nil {
		return 0, err
	}
	if !strings.EqualFold(col.engine, "InnoDB") {
		return 0, fmt.Errorf("%w: the tag table %s must be InnoDB", ErrSetup, f.tagTable)
	}
	return col.ordinal, nil
}

// privilege wraps ErrSetup around a server's refusal for want of a
// privilege, saying which.
func privilege(err error) error {
	var me *gomysql.MyError
	if !errors.As(err, &me) {
		return err
	}
	switch me.Code {
	case gomysql.ER_ACCESS_DENIED_ERROR:
		return fmt.Errorf("%w: %v (a wrong user or password; for the binlog stream, also a user without REPLICATION SLAVE)", ErrSetup, err)
	case gomysql.ER_TABLEACCESS_DENIED_ERROR, gomysql.ER_COLUMNACCESS_DENIED_ERROR, gomysql.ER_DBACCESS_DENIED_ERROR, gomysql.ER_SPECIFIC_ACCESS_DENIED_ERROR:
		return fmt.Errorf("%w: %v (GRANT SELECT ON the table, and CREATE, INSERT and UPDATE ON the heartbeat table, TO the follower's user)", ErrSetup, err)
	}
	return err
}

// errUndecodable is wrapped by the error of a stream that sent an event
// the decoder cannot read: a rows event without the table map before it
// (the stream began inside a transaction: a position of another history),
// or an event of a kind or version it does not know. Streaming from the
// same place again fails again: the next session reads the table.
var errUndecodable = errors.New("mysql: the binlog stream sent an event that cannot be decoded")

// streamError says what a failure of the binlog stream means.
func streamError(err error, at gomysql.Position, id uint32) error {
	var ee *replication.EventError
	if errors.As(err, &ee) {
		// Not ee.Error(): it quotes the whole event, which may be megabytes.
		h := ee.Header
		if h == nil {
			h = new(replication.EventHeader)
		}
		return fmt.Errorf("%w: %v event of %d bytes ending at %d (the stream began at %s:%d): %s",
			errUndecodable, h.EventType, h.EventSize, h.LogPos, at.Name, at.Pos, ee.Err)
	}
	var me *gomysql.MyError
	if errors.As(err, &me) {
		switch me.Code {
		case gomysql.ER_MASTER_FATAL_ERROR_READING_BINLOG:
			return fmt.Errorf("mysql: the binlog from %s:%d cannot be read (purged, or the binlog was reset): %w", at.Name, at.Pos, err)
		case gomysql.ER_ACCESS_DENIED_ERROR:
			return fmt.Errorf("%w: the binlog stream was refused: %v: the server answers so to a user without the REPLICATION SLAVE privilege, not only to a wrong password: GRANT REPLICATION SLAVE ON *.* TO the follower's user", ErrSetup, err)
		case 4052: // ER_SLAVE_SAME_ID (MariaDB)
			return fmt.Errorf("mysql: another binlog reader connected with server id %d and the server dropped this one: give each Follower an id of its own (WithServerID): %w", id, err)
		}
	}
	return fmt.Errorf("mysql: binlog stream: %w", err)
}
