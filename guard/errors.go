package guard

import (
	"errors"
	"fmt"
)

// ErrFull is returned by [Guard.Add] and its variants when the key's shard
// has no free slot for the key and cannot double: it has doubled 8 times
// (256× its initial size), or doubling would pass the memory cap set with
// [WithMaxBytes] (the error then also says so). The key was not added and
// every key added before is still present. Test for it with [errors.Is].
var ErrFull = errors.New("guard: full")

// errFullMaxBytes is ErrFull caused by the memory cap.
var errFullMaxBytes = fmt.Errorf("%w: memory cap reached", ErrFull)

// ErrClosed is returned by [Guard.Add] and its variants after
// [Guard.Close]. Lookups and removes keep working after Close.
var ErrClosed = errors.New("guard: closed")

// ErrNotFound is returned by [Loader.Get] for a key that is not in the
// store, whether the guard knew it is absent (the store was not asked) or
// the store said so (see [WithNotFound]).
var ErrNotFound = errors.New("guard: not found")

// ErrMaybeWritten tells [Loader.Insert] that a write failed in a way that
// leaves its outcome unknown (say, a commit whose acknowledgement was
// lost). Wrap such errors with it: Insert then keeps the key in the guard,
// a possible false positive, instead of rolling it back, a possible false
// negative. [NotWritten] already treats context and connection errors this
// way.
var ErrMaybeWritten = errors.New("guard: write may have happened")
