package mysql

import (
	"fmt"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"

	"github.com/cuckooguard/cuckooguard/follow"
)

// A table's identity (follow.TableIdentity), as a relay's Source and its
// followers' control rows see it: its InnoDB table id where the user may
// read information_schema.INNODB_SYS_TABLES (the PROCESS privilege), 0
// otherwise; and a version: the table's CREATE_TIME (which RENAME, DROP
// and CREATE, and an ALTER that rebuilds the table change; to the
// second), a "/" and a hash of its key column's type and collation. A
// rename swap, a DROP and CREATE, or a change of the key column's type
// changes it. The Source and its followers must have the same privileges:
// a follower whose identities carry no table id, where the relay's do,
// never follows. A name that names no table has the version "none".

// identitySQL returns an SQL expression of the identity of schema.table,
// keyed by key, as TableIdentity.String writes it; withID: the table id
// may be read.
func identitySQL(schema, table, key string, withID bool) string {
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	id := "'-'"
	if withID {
		// InnoDB names a table "schema/table", with "$" written @0024.
		name := strings.ReplaceAll(schema+"/"+table, "$", "@0024")
		id = "IFNULL((SELECT CAST(TABLE_ID AS CHAR) FROM information_schema.INNODB_SYS_TABLES WHERE NAME = " + lit(name) + "), '-')"
	}
	version := "IFNULL((SELECT CONCAT(DATE_FORMAT(t.CREATE_TIME, '%Y%m%dT%H%i%s'), '/', LEFT(MD5(CONCAT(c.COLUMN_TYPE, '/', IFNULL(c.COLLATION_NAME, ''))), 8))" +
		" FROM information_schema.TABLES t JOIN information_schema.COLUMNS c ON c.TABLE_SCHEMA = " + lit(schema) + " AND c.TABLE_NAME = " + lit(table) +
		" AND c.COLUMN_NAME = " + lit(key) + " WHERE t.TABLE_SCHEMA = " + lit(schema) + " AND t.TABLE_NAME = " + lit(table) + "), 'none')"
	return "CONCAT(" + id + ", ' ', " + version + ")"
}

// canReadIDs reports whether c's user may read InnoDB's table ids.
func canReadIDs(c *client.Conn) bool {
	_, err := c.Execute("SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES LIMIT 0")
	return err == nil
}

// readIdentity reads the identity of schema.table through c.
func readIdentity(c *client.Conn, schema, table, key string, withID bool) (follow.TableIdentity, error) {
	r, err := c.Execute("SELECT " + identitySQL(schema, table, key, withID))
	if err != nil {
		return follow.TableIdentity{}, fmt.Errorf("mysql: read the identity of %s.%s: %w", schema, table, privilege(err))
	}
	s, _ := r.GetString(0, 0)
	return follow.ParseTableIdentity(s)
}

// ensureTable creates table with columns (SQL) if it is missing: it
// writes no DDL when the table exists, since every binlog reader's stream
// carries the statement.
func ensureTable(c *client.Conn, db, table, columns string) error {
	r, err := c.Execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", db, table)
	if err != nil {
		return fmt.Errorf("mysql: look for table %s: %w", table, privilege(err))
	}
	if n, _ := r.GetInt(0, 0); n > 0 {
		return nil
	}
	if _, err := c.Execute("CREATE TABLE IF NOT EXISTS `" + table + "` (" + columns + ") ENGINE=InnoDB"); err != nil {
		return fmt.Errorf("%w: create table %s: %v (GRANT CREATE, INSERT, UPDATE, DELETE ON %s.%s TO the relay's user, or create it)",
			ErrSetup, table, err, db, table)
	}
	return nil
}

// The columns of the relay's tables.
const (
	controlColumns = "id BIGINT NOT NULL PRIMARY KEY, route VARCHAR(255) NOT NULL, payload VARCHAR(255) NOT NULL, " +
		"seen VARCHAR(2048) CHARACTER SET ascii NOT NULL, updated TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
	relayColumns = "name VARCHAR(255) NOT NULL PRIMARY KEY, server_id INT UNSIGNED NOT NULL DEFAULT 0, file VARCHAR(255) NOT NULL DEFAULT '', " +
		"pos BIGINT UNSIGNED NOT NULL DEFAULT 0, gtid_pos VARCHAR(1024) NOT NULL DEFAULT '', term BIGINT UNSIGNED NOT NULL DEFAULT 0, " +
		"updated TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
	tagColumns = "id BIGINT NOT NULL PRIMARY KEY, tag MEDIUMBLOB NOT NULL"
)

// emitSQL returns the statement of a control row: (id, route, payload)
// as arguments, and seen, an SQL expression.
func emitSQL(seen string) string {
	return "INSERT INTO `" + controlTable + "` (id, route, payload, seen, updated) SELECT ?, ?, ?, " + seen + ", NOW(6)" +
		" ON DUPLICATE KEY UPDATE route = VALUES(route), payload = VALUES(payload), seen = VALUES(seen), updated = VALUES(updated)"
}
