package mysql

import "errors"

var (
	// ErrSetup is wrapped by the error of a server, or a user, that the
	// Follower cannot follow: no binary log, a binlog_format other than
	// ROW, a binlog_row_image other than FULL, a server without
	// binlog_snapshot_file (MySQL; MariaDB has it), a table that is not
	// InnoDB, a key column without a unique key of its own, or a missing
	// privilege. The message says what to change. [Follower.Run] returns
	// it after its first session; later sessions retry.
	ErrSetup = errors.New("mysql: the server cannot be followed as it is set up")

	// ErrKeyType is wrapped by the error of a key column whose equality
	// the guard cannot hold (a type it does not know, a collation whose
	// weights are not one per character, a character set other than
	// utf8mb4 and utf8mb3). The message names the column, its type or
	// collation, and what to do.
	ErrKeyType = errors.New("mysql: key column cannot be followed")

	// ErrNoToken is wrapped by the error of [WriteToken] on a server that
	// cannot give a token a Follower could judge: gtid_strict_mode is
	// OFF, or the binlog has GTIDs of more than one domain. The message
	// says what to change. A caller may go on without a token: its
	// lookups are answered as if it had not written.
	ErrNoToken = errors.New("mysql: the server gives no write token")
)

// The reasons a session ends for a full read, not a fault.
var (
	errTableChanged   = errors.New("mysql: DDL on the followed table")
	errBigTransaction = errors.New("mysql: a transaction changed more keys than a session holds")
)
