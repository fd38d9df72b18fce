package guard

import "errors"

// ErrFull is returned by [Guard.Add] and its variants when the key's shard
// is saturated: it has doubled 8 times (256× its initial size) and its
// table has no free slot for the key. The key was not added and every key
// added before is still present.
var ErrFull = errors.New("guard: full")

// ErrClosed is returned by [Guard.Add] and its variants after
// [Guard.Close]. Lookups and removes keep working after Close.
var ErrClosed = errors.New("guard: closed")
