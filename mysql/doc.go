// Package mysql keeps every process's guard in step with a MySQL or
// MariaDB table, from the server's row-based binary log.
//
// A [Follower] per process applies the table's changes to its
// guarded.Loader. Its first session (and one that cannot resume: see
// "Resuming") reads every key of the table inside
// START TRANSACTION WITH CONSISTENT SNAPSHOT and takes the binlog position
// from that same transaction (MariaDB's binlog_snapshot_file and
// binlog_snapshot_position, and the GTID at it with BINLOG_GTID_POS), so
// the read and the stream meet exactly: the read sees the transactions the
// binlog holds before the position, the stream carries the others. It
// streams the binlog from there (github.com/go-mysql-org/go-mysql, as a
// replica with a server id of its own, [WithServerID]) and applies each
// transaction at its commit (its XID event): the inserts of the key
// column at once, its deletes once the server has made the transaction
// visible; an update that changes the key removes the old key and adds
// the new one. Nothing of a transaction is applied before its commit.
//
// The server writes a transaction to the binlog, and its readers may have
// it, before the engine commits it and other sessions see it (under
// semi-synchronous replication with AFTER_SYNC, for as long as a replica
// takes to acknowledge it). A delete applied then would make its key read
// absent while queries still find the row. So a delete waits until a
// heartbeat that the binlog carries after it has been written (its
// statement returned): MariaDB commits in the engine in binlog order, so
// the delete is visible then. A
// deleted key reads present for about a heartbeat longer: a false
// positive. A key created again while its delete waits keeps its copy.
//
// # Liveness
//
// The Follower writes a heartbeat row of its own ([WithHeartbeatTable],
// one row per server id) every [WithHeartbeat], with a new value each
// time (an UPDATE that changes nothing writes no event), and expects it
// back in the binlog, behind every change committed before it. Readiness
// is a lease on the Loader ([guarded.Feed.ReadyUntil]): each heartbeat
// back makes the Loader ready until it was written plus the max lag
// ([WithMaxLag], 150 ms by default), so a stream that goes silent, a
// server that stops, or a process that was paused passes lookups through
// within the max lag, before anything is known to be wrong. The server's
// own heartbeat events prove only the connection, and are not used.
//
// # Resuming
//
// A session that ends for a lost connection, a server restart, another
// binlog reader with the Follower's server id (error 4052), or a heartbeat
// that does not come back within the deadline (a stalled route, a server
// that stopped answering) leaves the Loader's guard as it was after the
// last transaction it applied, and the deletions it still held. The next
// session streams the binlog from that transaction instead of reading the
// table, once it has proved the position belongs to the binlog it
// followed: the server's @@server_id is the one the position was taken
// on; the table's layout is the one its rows were decoded by; the binlog
// file is still listed (where the user may run SHOW BINARY LOGS, which
// needs BINLOG MONITOR) and reaches the position; the server's
// gtid_binlog_pos is at or past the position's in each GTID domain (RESET
// MASTER and a restored copy of the data directory move it back); and the
// first transaction the stream sends is, byte for byte, the last one the
// Follower applied (its GTID, where it begins and ends, and a hash of its
// events), which is not applied again. The last check is the one that
// tells a history reset or restored and then written past the position
// from the one followed: the GTID at the position may even be the same.
// The deletions held when the session ended are released once the new
// session's marker is back (it is in the binlog after them). The Loader
// passes lookups through from the end of one session until the marker of
// the next is back.
//
// # Reading again
//
// A session reads the table into a fresh guard (and the Loader passes
// every lookup through until it is done and its marker is back) at the
// first start, and after: a position it cannot prove (above), or one the
// server cannot stream from (purged, reset, or in the middle of an event
// of another history: error 1236 at the first read); a DDL statement or
// TRUNCATE that names the table (ALTER, RENAME, DROP and CREATE,
// TRUNCATE: the binlog carries them as text, and the table's layout may
// change); a write to the table in STATEMENT or MIXED format (its text
// names the table; its rows are not in the binlog); an XA transaction or
// a ROLLBACK TO SAVEPOINT around the table's rows; a transaction of more
// than 2^20 keys; a change the Loader refused; a session that ended
// before it applied a single transaction (nothing proves its position);
// and the Loader's request for a fresh guard. A transaction whose commit
// takes longer than the heartbeat deadline holds back every heartbeat
// behind it: the session is given up, and the next one resumes.
//
// # Restarting from a saved guard
//
// With [WithSnapshotFile] the Follower saves its guard to a file, with the
// position it reflects (the last transaction applied, as a resuming
// session proves it) and the deletions it still holds, every
// [WithSnapshotInterval] while the position moves and when Run returns.
// The first session of a new process restores the guard from the file
// and streams on from its position, without reading the table, after the
// same proof as a resume; a file that is missing, damaged, of another
// table, or whose position the server cannot prove, costs a read of the
// table, never a wrong answer. A guard with a shard that passes lookups
// through is not saved (its file is removed). The file is written to a
// temporary file beside it, synced and renamed over it.
//
// # This process's own writes
//
// A Loader's Insert adds its key before the write, as always. A
// transaction that names the key with [Follower.Tag] (or runs the
// statements of [Follower.TagStatements]) is skipped for exactly that
// key when the binlog brings it: the binlog carries no message of a
// transaction's own, so a tag is a row of the tag table ([WithTagTable]),
// inserted and deleted again in the same transaction. An insert left
// untagged is applied again: its key holds two copies, and after its
// delete one is left, a false positive (never a false negative) until the
// next read of the table; measured, 200 rows inserted through the Loader
// left 200 extra copies untagged, and 0 tagged (TestOwnInserts). Copies
// of a key are capped (guard.MaxCopies); a key inserted and deleted many
// times stays at the cap, which costs nothing more. Deletes, this
// process's own included, are applied from the binlog only.
//
// # Reading your own writes
//
// [WriteToken], called after a write's commit has returned, gives its
// consistency token ([guarded.Token]): the last GTID sequence number of
// the binlog's GTID domain, in a stream named after the server's
// @@server_id and the domain ("mariadb-1-0.2a"). It reads the server's
// @@gtid_binlog_pos, not the session's @@last_gtid, so any connection will
// do (a *sql.DB's pool, whichever connection it hands out); inside a
// transaction it returns an error, as the position would be before that
// transaction's commit. A Follower reports to its Loader
// ([guarded.Feed.Reached]) the position of each transaction of its
// server's default domain that it has applied, and at a session's start
// the position it read the table at or resumes from, so a token from
// before that is reached at once. A transaction's position is reached at
// its commit, though its deletions wait to be visible before they are
// applied: until then the guard holds their keys, and answers "present"
// (a false positive), never "absent" for a key the token's write made. A
// lookup under the token ([guarded.WithToken]) is
// answered "absent" only once the position is reached; it waits up to
// [guarded.WithTokenWait] and then passes through to the store.
//
// The sequence numbers of one domain follow the binlog's order only under
// gtid_strict_mode (without it a session may SET gtid_seq_no lower), so
// WriteToken returns an error wrapping [ErrNoToken] without it: SET
// GLOBAL gtid_strict_mode = ON. Positions of two domains are not
// comparable: on a server whose binlog has GTIDs of several domains
// WriteToken returns ErrNoToken too, and a token of a domain the Follower
// does not report (or of another server id: a replica made primary, which
// goes on with the same sequence numbers) passes through at once. RESET
// MASTER starts the sequence numbers again at 1 under the same name: a
// Loader whose Follower has not noticed yet would judge a new token below
// its old position reached. It notices when a heartbeat does not come
// back (the stream of the old binlog goes silent): the Loader passes
// every lookup through once its lease runs out, at most the max lag
// after the last heartbeat back, and reads the new history. Until then a
// lookup under a token of the new history can read absent for a key its
// write made (in the tests, up to 109 of 140 such lookups within the max
// lag after RESET MASTER returned, none after): do not RESET MASTER a
// server whose binlog is followed. A token of the old
// history is reached once the new history passes its position, rightly:
// the Follower's read of the new history holds every older write.
//
// # What the binlog cannot show
//
//   - A key changed by ON UPDATE CASCADE (or ON DELETE CASCADE, SET NULL):
//     the server logs only the parent's row, not the child's. Do not key a
//     followed table by a column a foreign key cascades into.
//   - A session with sql_log_bin=0 writes nothing to the binlog.
//   - A table that is not InnoDB (the consistent snapshot covers InnoDB
//     alone): refused at the start.
//
// # Key equality
//
// Keys reach the Loader in one text per key, the server's own equality
// (the Follower installs the rule in the Loader with
// [guarded.Feed.SetKeyRule], so lookups in any form the server reads as
// the key find it): an integer in decimal, unsigned as unsigned (the
// column's type says so; the binlog does not); a DECIMAL without trailing
// zeros; VARBINARY and BLOB as stored; a utf8mb4 or utf8mb3 text under a
// _bin collation as stored, without trailing spaces under PAD SPACE;
// under a collation that weighs each character alone with one 16-bit
// weight (utf8mb4_general_ci, the default, and utf8mb4_general_nopad_ci,
// utf8mb3_general_ci), each character replaced by the lowest character of
// its weight, without trailing spaces under PAD SPACE. Under the UCA
// collations without a language's tailoring (utf8mb4_unicode_ci,
// utf8mb4_unicode_520_ci, their _nopad_ kin and utf8mb3 ones), whose
// characters weigh as none (combining accents), one or several weights
// ('ß' as 'ss'), the form is built from the text's weight string alone,
// less the space's trailing weights under PAD SPACE: the fewest
// characters that weigh as it, each the lowest of its weights ("Straße"
// is "STRASSE"); the server reads it as the key. Those weights are read
// from the server's own WEIGHT_STRING at the start (every BMP character;
// under UCA, every character, a table of about 4 MB per collation), and
// the form is checked against the server's = on random texts before it
// is used. A DATETIME(p) as the server prints it, with exactly p fraction
// digits, from its own print or from 'Y-M-D[( |T)h:m[:s[.f]]]',
// 'YYYYMMDD' or 'YYYYMMDDhhmmss[.f]' (other spellings, a zero month or
// day in another spelling than the print, and more than p fraction digits
// that are not zeros go to the store). A DATE as 'YYYY-MM-DD', from the
// same spellings at midnight (the server compares a DATE with a text as a
// DATETIME). A TIME(p) as '[-]hh:mm:ss[.f]' with exactly p fraction
// digits and no sign on zero, from '[-]h:m:s[.f]' and '[-]h:m' (11:12 is
// 11:12:00) in range (the server reads '00:60:00' as 00:00:00, so other
// spellings go to the store). An ENUM as its member's text as defined (the
// binlog carries its index), from any text the column's collation makes
// equal to it; the error value, index 0, is the empty text. Any other column is
// refused with [ErrKeyType], naming the column, its type or collation and
// the fix: the uca1400 collations and the language ones
// (utf8mb4_german2_ci, utf8mb4_czech_ci, ...), which may join two
// characters into one weight (contractions: И and U+0306 weigh as Й under
// utf8mb4_uca1400_ai_ci, 'ch' as one letter under utf8mb4_czech_ci) that
// the server does not list; BINARY(n), floating point, TIMESTAMP (a
// lookup's text means an instant in its session's time_zone), YEAR, SET,
// an ENUM with a member that has a backslash, a '?' or a 4-byte
// character (information_schema writes one as '?') or that is empty,
// other character sets.
//
// # Behind a relay
//
// [Relayed] returns the database as package fanout relays it: one relay
// per database (any replica, elected by a lease) reads the binlog once
// for all its tables and publishes their changes to NATS JetStream, and
// every replica's fanout.Follower follows the stream instead of the
// binlog. The relay's Source passes on a transaction that changed a table
// once a write it began after receiving the transaction has returned (the
// server sends a transaction to binlog readers before it is visible;
// MariaDB makes transactions visible in binlog order); it finds each
// row's key by its column's name in the binlog's table map, never by
// position; DDL that names a table (ALTER, RENAME, DROP, CREATE,
// TRUNCATE) and a transaction of more than 2^20 keys make its followers
// read it again. It saves its place (the binlog file, the offset and the
// GTID position of the last transaction its broker acknowledged) in
// cuckooguard_relay, and a relay that restarts or takes over resumes
// there if the server is the same (server_id), still holds that file at
// least that long and is not behind that GTID position; otherwise it
// starts at the binlog's end and its followers read the tables again
// (binlogs purged past it, RESET MASTER, a restored server). A position
// is the file's index times 2^32 plus the offset: one that goes back is a
// database that went back, which the followers read again. The lease is a
// GET_LOCK on a connection whose wait_timeout is the lease's length; its
// term is a counter in cuckooguard_relay. Each transaction passed on
// carries, besides its position, its GTID sequence number in the server's
// default domain (follow.Commit.Token): a relayed Follower reports those
// to its Loader in [WriteToken]'s stream, so tokens read through the
// relay as they do behind a direct Follower (RESET MASTER included: see
// "Reading your own writes").
//
// The server, besides the Follower's setup: binlog_row_metadata=FULL
// (SET GLOBAL binlog_row_metadata = 'FULL', and in the server's
// configuration: a server restarted without it stops the relay with
// [ErrSetup]). The relay's user: REPLICATION SLAVE on *.*, BINLOG MONITOR
// (SHOW MASTER STATUS, SHOW BINARY LOGS), SELECT on the tables, and
// CREATE (once), INSERT, UPDATE and DELETE on cuckooguard_relay and
// cuckooguard_control. The followers' user: SELECT on the table,
// INSERT, UPDATE and DELETE on cuckooguard_control; the writers' user:
// INSERT and DELETE on cuckooguard_tag, for fanout.Follower.Tag (through
// [ExecIn]: its statement is a compound statement, BEGIN NOT ATOMIC …
// END, with no parameters). PROCESS, where the relay and its followers
// all have it, adds InnoDB's table id to a table's identity; otherwise a
// rename swap within the second of the table's creation is seen only
// through the binlog's RENAME.
//
//	db, err := mysql.Relayed("relay:pw@tcp(db:3306)/shop")
//	relay, err := fanout.NewRelay(db, "users-api", nc, []follow.Table{{Table: "users", Key: "id"}})
//	follower, err := fanout.NewFollower(loader, nc, db, "users", "id", parse, fanout.WithRelay("users-api"))
//
// # Setup
//
// The server: log_bin on, binlog_format=ROW, binlog_row_image=FULL
// (checked at the start). The Follower's user: REPLICATION SLAVE on *.*
// (without it the server refuses the binlog stream with error 1045, which
// reads like a wrong password), SELECT on the table, CREATE (once),
// INSERT and UPDATE on the heartbeat table, and CREATE (once) for the tag
// table; BINLOG MONITOR lets it check that a binlog file is still there
// before it resumes (without it, the stream's error 1236 says so). The
// writers' user: INSERT and DELETE on the tag table, for Tag. The key column needs a
// PRIMARY KEY or a UNIQUE key of its own, NOT NULL. A setup that cannot
// work is an [ErrSetup] error that says what to change.
//
//	loader, err := guarded.New(g, store)
//	f, err := mysql.NewFollower(loader, "follower:pw@tcp(db:3306)/shop", "users", "id",
//		func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) },
//		mysql.WithServerID(replicaID), // unique among the binlog's readers
//		mysql.WithSnapshotFile("/var/lib/app/users.guard")) // optional: restart without reading the table
//	go func() {
//		if err := f.Run(ctx); err != nil && ctx.Err() == nil {
//			logger.Error("follower", "error", err)
//		}
//	}()
package mysql
