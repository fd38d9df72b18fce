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
