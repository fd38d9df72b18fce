package guard

import (
	"errors"

	"github.com/cuckooguard/cuckooguard/shard"
)

// ErrFull is returned, wrapped, by [Guard.Add] and its variants when the
// key's shard has no free slot for the key and doubling cannot help:
// doubling would pass the memory cap set with [WithMaxBytes], or the shard
// is less than half full and the key's buckets are crowded with keys that
// agree with it on every bit the shard compares (keys found by someone who
// knows the seed, or a fantastically unlucky draw), where a doubling would
// not separate them. The error then says which. The key was not added and
// every key added before is still present. Test for it with [errors.Is].
//
// It is [shard.ErrFull]: the shards' growth policy decides when a shard
// is full, and says so once.
var ErrFull = shard.ErrFull

// ErrTooManyCopies is returned by [Guard.Add] and its variants for a key
// of which the guard holds [MaxCopies] copies already: the key is present,
// nothing was added, and no memory was spent. A key added over and over
// (a retried insert, a loop) costs at most MaxCopies slots. [Stats]
// counts the refusals. It is [shard.ErrTooManyCopies].
var ErrTooManyCopies = shard.ErrTooManyCopies

// ErrClosed is returned by [Guard.Add] and its variants after
// [Guard.Close]. Lookups and removes keep working after Close.
var ErrClosed = errors.New("guard: closed")

// ErrSnapshot is returned by [Restore] for input that is not a valid
// snapshot: wrong magic or version, impossible sizes, corrupt shard
// contents or a checksum mismatch. The error wraps it with the details.
var ErrSnapshot = errors.New("guard: invalid snapshot")
