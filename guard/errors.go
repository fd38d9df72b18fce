package guard

import (
	"errors"
	"fmt"
)

// ErrFull is returned by [Guard.Add] and its variants when the key's shard
// has no free slot for the key and doubling cannot help: doubling would
// pass the memory cap set with [WithMaxBytes], or the shard is less than
// half full and the key's buckets are crowded with keys that agree with it
// on every bit the shard compares (keys found by someone who knows the
// seed, or a fantastically unlucky draw), where a doubling would not
// separate them. The error then says which. The key was not added and
// every key added before is still present. Test for it with [errors.Is].
var ErrFull = errors.New("guard: full")

// errFullMaxBytes is ErrFull caused by the memory cap.
var errFullMaxBytes = fmt.Errorf("%w: memory cap reached", ErrFull)

// errFullCrowded is ErrFull caused by colliding keys.
var errFullCrowded = fmt.Errorf("%w: keys that collide crowd this key's buckets (doubling would not separate them)", ErrFull)

// ErrTooManyCopies is returned by [Guard.Add] and its variants for a key
// of which the guard holds [MaxCopies] copies already: the key is present,
// nothing was added, and no memory was spent. A key added over and over
// (a retried insert, a loop) costs at most MaxCopies slots. [Stats]
// counts the refusals.
var ErrTooManyCopies = errors.New("guard: too many copies of one key")

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
