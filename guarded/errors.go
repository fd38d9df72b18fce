package guarded

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
)

// ErrNotFound is returned by [Loader.Get] and [Loader.GetMany] for a key
// that is not in the store, whether the guard knew it is absent (the store
// was not asked) or the store said so (see [WithNotFound]).
var ErrNotFound = errors.New("guarded: not found")

// ErrMaybeWritten tells [Loader.Insert] that a write failed in a way that
// leaves its outcome unknown (say, a commit whose acknowledgement was
// lost). Wrap such errors with it: Insert then keeps the key in the guard,
// a possible false positive, instead of rolling it back, a possible false
// negative. [NotWritten] already treats context and connection errors this
// way.
var ErrMaybeWritten = errors.New("guarded: write may have happened")

// ErrClosed is returned by [Loader.Insert], [Loader.Fill] and
// [Loader.CatchUp] after [Loader.Close]. Lookups keep working after Close.
var ErrClosed = errors.New("guarded: closed")

// errOwned is returned by [New] for a guard that another Loader owns.
var errOwned = errors.New("guarded: the guard already has a Loader, which closes it; give each Loader a guard of its own")

// NotWritten is the default of [WithRollback]: it reports whether a failed
// write's error shows that the write certainly changed nothing, so that
// [Loader.Insert] may take the key back out of the guard.
//
// It reports false (the row may have been written) for [ErrMaybeWritten],
// a cancelled or expired context, and a lost or broken connection
// ([net.Error], [io.EOF], [io.ErrUnexpectedEOF], [driver.ErrBadConn],
// [sql.ErrConnDone], [sql.ErrTxDone], ECONNRESET, ECONNABORTED, EPIPE),
// because the store may have committed the write before the client stopped
// listening. An error that says it is safe to retry (a SafeToRetry() bool
// method reporting true, as pgconn's errors have: nothing reached the
// server) is certain. Every other error, such as a constraint violation
// the store reported, is taken as certain too.
func NotWritten(err error) bool {
	var safe interface{ SafeToRetry() bool }
	if errors.As(err, &safe) && safe.SafeToRetry() {
		return true
	}
	var nerr net.Error
	switch {
	case errors.Is(err, ErrMaybeWritten),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &nerr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone), errors.Is(err, sql.ErrTxDone),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE):
		return false
	}
	return true
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
