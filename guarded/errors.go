package guarded

import (
	"context"
	"errors"
	"fmt"

	"github.com/cuckooguard/cuckooguard/guard"
)

// ErrNotFound is returned by [Loader.Get] and [Loader.GetMany] for a key
// that is not in the store, whether the guard knew it is absent (the store
// was not asked) or the store said so (see [WithNotFound]).
var ErrNotFound = errors.New("guarded: not found")

// ErrNotWritten tells [Loader.Insert] that a write certainly changed
// nothing, so that the key may leave the guard again. Wrap it into the
// write's error when your code knows that, for a store whose errors
// [NotWritten] cannot read (anything but a server's SQLSTATE):
//
//	if n == 0 { // ON CONFLICT DO NOTHING inserted no row
//		return fmt.Errorf("%w: %w", ErrUserExists, guarded.ErrNotWritten)
//	}
var ErrNotWritten = errors.New("guarded: not written")

// ErrMaybeWritten tells [Loader.Insert] that a write failed in a way that
// leaves its outcome unknown, whatever else its error says: Insert then
// keeps the key in the guard. [NotWritten] keeps it for every error it
// cannot prove harmless anyway; wrap ErrMaybeWritten into an error that
// carries a SQLSTATE from a step after the commit, so that the SQLSTATE is
// not taken for the commit's.
var ErrMaybeWritten = errors.New("guarded: write may have happened")

// ErrClosed is returned by [Loader.Insert], [Loader.Fill] and
// [Loader.CatchUp] after [Loader.Close]. Lookups keep working after Close.
//
// A Loader closes its guard, and returns ErrClosed where the guard returns
// [guard.ErrClosed]; errors.Is(err, guard.ErrClosed) holds for it too, so
// that code that handles a closed guard handles a closed Loader.
var ErrClosed error = closedError{}

// closedError is the type of ErrClosed: it is guard.ErrClosed too.
type closedError struct{}

func (closedError) Error() string        { return "guarded: closed" }
func (closedError) Is(target error) bool { return target == guard.ErrClosed }

// errNoStore is returned by [New] for a nil store.
var errNoStore = errors.New("guarded: New needs a store")

// errOwned is returned by [New] for a guard that another Loader owns.
var errOwned = errors.New("guarded: the guard already has a Loader, which closes it; give each Loader a guard of its own")

// NotWritten is the default of [WithRollback]: it reports whether a failed
// write's error proves that the store did not commit the write, so that
// [Loader.Insert] may take the key back out of the guard. A key kept for a
// write that did not happen costs one false positive; a key taken back for
// a write that did commit reads absent until the next rebuild, a wrong 404.
// So NotWritten reports true only for proof:
//
//   - an error wrapping [ErrNotWritten], which the caller's code returns
//     when it knows (say, an INSERT … ON CONFLICT DO NOTHING that inserted
//     no row);
//   - an error the database server answered for the statement or the
//     commit: an error with a SQLState() string method, as pgx's
//     *pgconn.PgError and lib/pq's *pq.Error have, such as a unique
//     violation (23505) or a serialization failure (40001). The server
//     rolled the transaction back. Not so for the classes that a server
//     sends about its connection or itself rather than about the
//     statement, after which a commit may have happened: 08 (connection
//     exception), 57 (operator intervention: a shutdown, a terminated
//     backend, a cancelled wait for a synchronous standby), 58 (system
//     error), XX (internal error) and HV (foreign data wrapper), nor for
//     40003 (statement completion unknown).
//
// Everything else keeps the key: [ErrMaybeWritten], a cancelled or expired
// context, a closed or reset connection, a timeout, an error type it does
// not know, and a driver's "safe to retry" (pgx reports a connection that
// broke while it read the COMMIT reply as safe to retry, although the
// server may have committed).
func NotWritten(err error) bool {
	if err == nil || errors.Is(err, ErrMaybeWritten) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, ErrNotWritten) {
		return true
	}
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && refused(coded.SQLState())
}

// refused reports whether a server error with SQLSTATE code shows that the
// server rolled the transaction back (see NotWritten).
func refused(code string) bool {
	if len(code) != 5 || code == "40003" {
		return false
	}
	switch code[:2] {
	case "00", "01", "02", // success, warning, no data: not an error
		"08", "57", "58", "XX", "HV":
		return false
	}
	return true
}

// errNil is the error of a call of method with a nil argument arg.
func errNil(method, arg string) error {
	return fmt.Errorf("guarded: %s: %s is nil", method, arg)
}

// wrap says which operation failed, unless err speaks for itself: ErrClosed
// and the context's errors are returned as they are, so that callers can
// compare them and messages do not repeat a prefix ("guarded: insert:
// guarded: closed").
func wrap(op string, err error) error {
	if err == nil || err == ErrClosed || err == context.Canceled || err == context.DeadlineExceeded {
		return err
	}
	return fmt.Errorf("guarded: %s: %w", op, err)
}

// errFeedAttached ends a rebuild from the key source when a change feed
// attached while it ran (see Loader.install).
var errFeedAttached = errors.New("guarded: a change feed attached during the rebuild")

// errDetached is returned by a Feed's methods after Detach.
var errDetached = errors.New("guarded: the feed is detached")

// errGoexit is what the waiters of a lookup that called runtime.Goexit
// get.
var errGoexit = errors.New("guarded: the store lookup called runtime.Goexit")
