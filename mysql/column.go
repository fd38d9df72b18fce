package mysql

import (
	"fmt"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"
)

// column is what the server says of the key column, and of its table.
type column struct {
	schema     string // the database, as the server spells it (and the binlog)
	table      string // the table, as the server spells it (and the binlog)
	name       string
	ordinal    int    // 0-based, as in the binlog's rows
	columns    int    // of the table
	dataType   string // DATA_TYPE: int, varchar, decimal, ...
	columnType string // COLUMN_TYPE: int(10) unsigned, varchar(64), enum('a','B') (members as defined), ...
	charset    string // "" for a type without one
	collation  string
	nullable   bool
	engine     string
	uniqueKey  string // the name of a unique key of the column alone; "" if none
}

// same reports whether c and o describe one layout: the binlog's rows of
// a table described by c decode as rows described by o.
func (c column) same(o column) bool { return c == o }

// describe reads what the server says of db.table's column key. Each
// information_schema table is asked by a constant schema and table name:
// the server then opens that table alone, where a name taken from another
// row (a correlated subquery, a join's ON) makes it open every table of
// every schema, some 25 ms each time on an idle server with few tables.
func describe(conn *client.Conn, db, table, key string) (column, error) {
	r, err := conn.Execute(`SELECT c.TABLE_SCHEMA, c.TABLE_NAME, c.ORDINAL_POSITION, c.DATA_TYPE, c.COLUMN_TYPE,
		IFNULL(c.CHARACTER_SET_NAME, ''), IFNULL(c.COLLATION_NAME, ''), c.IS_NULLABLE, IFNULL(t.ENGINE, ''),
		(SELECT COUNT(*) FROM information_schema.COLUMNS a WHERE a.TABLE_SCHEMA = ? AND a.TABLE_NAME = ?),
		IFNULL((SELECT s.INDEX_NAME FROM information_schema.STATISTICS s
			WHERE s.TABLE_SCHEMA = ? AND s.TABLE_NAME = ? AND s.NON_UNIQUE = 0
			GROUP BY s.INDEX_NAME
			HAVING COUNT(*) = 1 AND MAX(s.COLUMN_NAME) = c.COLUMN_NAME AND MAX(s.SUB_PART) IS NULL
			ORDER BY s.INDEX_NAME <> 'PRIMARY', s.INDEX_NAME LIMIT 1), '')
		FROM information_schema.COLUMNS c JOIN information_schema.TABLES t
			ON t.TABLE_SCHEMA = ? AND t.TABLE_NAME = ?
		WHERE c.TABLE_SCHEMA = ? AND c.TABLE_NAME = ? AND c.COLUMN_NAME = ?`, db, table, db, table, db, table, db, table, key)
	if err != nil {
		return column{}, fmt.Errorf("mysql: read the key column %s.%s.%s: %w", db, table, key, privilege(err))
	}
	if r.RowNumber() != 1 {
		return column{}, fmt.Errorf("%w: %s.%s has no column %s (or the user may not see it: GRANT SELECT ON %s.%s)", ErrSetup, db, table, key, db, table)
	}
	str := func(i int) string { s, _ := r.GetString(0, i+2); return s }
	ord, _ := r.GetInt(0, 2)
	n, _ := r.GetInt(0, 9)
	dataType, columnType := strings.ToLower(str(1)), str(2)
	if dataType != "enum" && dataType != "set" { // their members keep their case
		columnType = strings.ToLower(columnType)
	}
	return column{schema: str(-2), table: str(-1), name: key, ordinal: int(ord) - 1, columns: int(n),
		dataType: dataType, columnType: columnType,
		charset: str(3), collation: str(4), nullable: str(5) == "YES",
		engine: str(6), uniqueKey: str(8)}, nil
}

// followable returns an error wrapping ErrSetup if the table or its key
// column cannot be followed.
func (c column) followable(table string) error {
	switch {
	case !strings.EqualFold(c.engine, "InnoDB"):
		// The consistent snapshot and the binlog position it gives
		// cover transactional tables alone.
		return fmt.Errorf("%w: table %s uses the %s engine; the follower reads it in a consistent snapshot, which only InnoDB gives: ALTER TABLE %s ENGINE=InnoDB",
			ErrSetup, table, c.engine, table)
	case c.uniqueKey == "":
		return fmt.Errorf("%w: column %s of %s has no PRIMARY KEY or UNIQUE key of its own (a key of the whole column, no prefix): add one (ALTER TABLE %s ADD PRIMARY KEY (%s) or ADD UNIQUE (%s))",
			ErrSetup, c.name, table, table, c.name, c.name)
	case c.nullable:
		return fmt.Errorf("%w: column %s of %s is NULL-able; a key must be NOT NULL: ALTER TABLE %s MODIFY %s %s NOT NULL",
			ErrSetup, c.name, table, table, c.name, c.columnType)
	}
	return nil
}
