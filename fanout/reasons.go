package fanout

import "errors"

// Why the table is read again, and what ends sessions: the keys of
// Stats.Reads and Stats.Failures.
const (
	readStart    = "start"     // no saved guard to start from
	readReset    = "reset"     // the relay reset the table
	readReread   = "reread"    // a TRUNCATE, or a transaction bigger than the relay holds back
	readGap      = "gap"       // messages are missing from the stream
	readStream   = "stream"    // the stream is another instance (deleted and made again), or of another database
	readRequest  = "requested" // the Loader asked for a fresh guard
	failDatabase = "database"  // the database connection failed
	failStream   = "stream"    // the stream or its consumer failed
	failNATS     = "nats"      // the NATS connection is down
	failSetup    = "setup"     // the table or the stream cannot be found
	failTable    = "table"     // the relay streams another table than the name names, or under another publication
)

// ReadReasons lists the keys of Stats.Reads: why a Follower read its table
// again. "start" (no saved guard to start from) and "requested" (the
// Loader asked) are routine; "reset" (the relay reset the table), "reread"
// (a TRUNCATE, or a transaction bigger than the relay holds back), "gap"
// (messages missing from the stream) and "stream" (the stream was deleted
// and made again) are worth a look when they repeat. Collectors use it to
// export every reason from the first scrape.
var ReadReasons = []string{readStart, readReset, readReread, readGap, readStream, readRequest}

// FailureReasons lists the keys of Stats.Failures: what ended a Follower's
// session: "database" (the database connection failed), "stream" (the
// stream or its consumer failed), "nats" (the NATS connection went down),
// "setup" (the table or the stream cannot be found), "table" (a marker or
// heartbeat found that the relay streams another table than the one its
// name names, or under another publication: a rename swap, a DROP and
// CREATE, a publication changed; or a relay that does not say which).
var FailureReasons = []string{failDatabase, failStream, failNATS, failSetup, failTable}

// reread ends a session that must read the table again, for why.
type reread struct{ why string }

func (r *reread) Error() string { return "fanout: the table must be read again: " + r.why }

// failure tags an error with what ended the session.
type failure struct {
	what string
	err  error
}

func (e *failure) Error() string { return e.err.Error() }
func (e *failure) Unwrap() error { return e.err }

func failureOf(err error) string {
	var f *failure
	if errors.As(err, &f) {
		return f.what
	}
	return failStream
}
