package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// WriteToken returns the consistency token ([guarded.Token]) of every
// write committed before it is called: the database's identity
// ([Database.Token], the token's stream) and the end of its write-ahead
// log then. Call it after the write's commit has returned, on any
// connection to the primary (the pool the write went through, even behind
// a transaction-pooling PgBouncer: the position is the server's, not the
// session's). A Loader that a logical-decoding [Follower] (or a relayed
// follower of package fanout) keeps answers "absent" for a lookup made
// under the token only once its stream has applied every change committed
// before it ([guarded.WithToken]). A [WithNotify] follower reports no
// positions: lookups under a token pass through to the store.
//
// It costs one round trip, and no privilege beyond connecting.
func WriteToken(ctx context.Context, conn Conn) (guarded.Token, error) {
	if ctx == nil || noConn(conn) {
		return guarded.Token{}, errors.New("postgres: WriteToken needs a context and a connection")
	}
	var system, oid, lsnText string
	var block int64
	var segmentText string
	err := conn.QueryRow(ctx, `SELECT s.system_identifier::text, d.oid::text, pg_current_wal_insert_lsn()::text,
			current_setting('wal_block_size')::int8, current_setting('wal_segment_size', true)
		FROM pg_control_system() s, pg_database d WHERE d.datname = current_database()`, pgx.QueryExecModeSimpleProtocol).
		Scan(&system, &oid, &lsnText, &block, &segmentText)
	if err != nil {
		return guarded.Token{}, fmt.Errorf("postgres: write token: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		return guarded.Token{}, fmt.Errorf("postgres: write token: position %q: %w", lsnText, err)
	}
	sys, err1 := strconv.ParseUint(system, 10, 64)
	o, err2 := strconv.ParseUint(oid, 10, 32)
	segment, err3 := parseSize(segmentText)
	if err := errors.Join(err1, err2, err3); err != nil {
		return guarded.Token{}, fmt.Errorf("postgres: write token: database identity: %w", err)
	}
	db := Database{System: sys, OID: uint32(o)}
	return guarded.NewToken(db.Token(), uint64(commitBound(lsn, block, segment)))
}

// commitBound returns where the last record before insert, the server's
// WAL insert position after a commit, ends. The insert position after a
// record that ends exactly at a page's end is past the next page's
// header, while the stream reports the record's end as the page's end: an
// idle server would then not reach the token until its next record. No
// record ends inside a page header, so the header's start is as good a
// bound and is reached with the commit itself.
func commitBound(insert pglogrepl.LSN, block, segment int64) pglogrepl.LSN {
	const short, long = 24, 40 // MAXALIGN'd XLogPageHeaderData and XLogLongPageHeaderData
	switch {
	case segment > 0 && int64(insert)%segment == long:
		return insert - long
	case block > 0 && int64(insert)%block == short && (segment <= 0 || int64(insert)%segment != short):
		return insert - short
	}
	return insert
}

// parseSize reads a size setting as PostgreSQL shows it: "16MB", "8kB",
// "1GB", or bytes.
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}}
	for _, u := range units {
		if len(s) > len(u.suffix) && s[len(s)-len(u.suffix):] == u.suffix {
			n, err := strconv.ParseInt(s[:len(s)-len(u.suffix)], 10, 64)
			return n * u.mult, err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}
