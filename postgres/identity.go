package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/jackc/pgx/v5"
)

// Database identifies a PostgreSQL database wherever its changes travel:
// the system identifier of its cluster (pg_control_system(), the same on
// every server of a physical replica set and after a restart) and the
// database's oid within it. Two databases of one cluster, and databases of
// two clusters, have different identities; a stream or a saved guard that
// carries one is refused by a reader of another.
type Database struct {
	System uint64 // the cluster's system identifier
	OID    uint32 // the database's oid
	Name   string // the database's name, for messages only
}

// IdentifyDatabase returns the identity of the database conn is connected
// to. It needs no privilege beyond connecting.
func IdentifyDatabase(ctx context.Context, conn Conn) (Database, error) {
	if ctx == nil || noConn(conn) {
		return Database{}, errors.New("postgres: IdentifyDatabase needs a context and a connection")
	}
	var d Database
	var system, oid string
	err := conn.QueryRow(ctx, `SELECT s.system_identifier::text, d.oid::text, d.datname
		FROM pg_control_system() s, pg_database d WHERE d.datname = current_database()`, pgx.QueryExecModeSimpleProtocol).
		Scan(&system, &oid, &d.Name)
	if err != nil {
		return Database{}, fmt.Errorf("postgres: identify the database: %w", err)
	}
	if d.System, err = strconv.ParseUint(system, 10, 64); err != nil {
		return Database{}, fmt.Errorf("postgres: identify the database: system identifier %q: %w", system, err)
	}
	o, err := strconv.ParseUint(oid, 10, 32)
	if err != nil {
		return Database{}, fmt.Errorf("postgres: identify the database: oid %q: %w", oid, err)
	}
	d.OID = uint32(o)
	return d, nil
}

// Token returns the identity as one token of letters and digits,
// "<system>_<oid>", for names (a NATS subject, an object's name).
func (d Database) Token() string {
	return strconv.FormatUint(d.System, 10) + "_" + strconv.FormatUint(uint64(d.OID), 10)
}

// Origin returns d as the stream of its changes names it: the Origin a
// relay's messages and saved guards carry.
func (d Database) Origin() follow.Origin {
	if d.IsZero() {
		return follow.Origin{}
	}
	return follow.Origin{Token: d.Token(), Name: d.String()}
}

// IsZero reports whether d identifies nothing.
func (d Database) IsZero() bool { return d.System == 0 && d.OID == 0 }

// Same reports whether d and o identify the same database (their names
// are not compared: a database can be renamed).
func (d Database) Same(o Database) bool { return d.System == o.System && d.OID == o.OID }

// String describes d for a message: its name, system identifier and oid.
func (d Database) String() string {
	if d.IsZero() {
		return "no database"
	}
	return fmt.Sprintf("database %q (system %d, oid %d)", d.Name, d.System, d.OID)
}

// ParseDatabaseToken is the inverse of [Database.Token] (without the name).
func ParseDatabaseToken(s string) (Database, error) {
	var d Database
	for i := len(s) - 1; i > 0; i-- {
		if s[i] != '_' {
			continue
		}
		sys, err1 := strconv.ParseUint(s[:i], 10, 64)
		oid, err2 := strconv.ParseUint(s[i+1:], 10, 32)
		if err1 != nil || err2 != nil {
			break
		}
		d.System, d.OID = sys, uint32(oid)
		return d, nil
	}
	return Database{}, fmt.Errorf("postgres: %q is not a database token (<system>_<oid>)", s)
}
