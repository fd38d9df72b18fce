package follow

import "github.com/cuckooguard/cuckooguard/guarded"

// State is what a follower is doing.
type State int32

// The states of a follower.
const (
	PassThrough State = iota // not connected: the Loader passes every lookup through
	Resyncing                // reading the table, or catching up from a saved position; lookups pass through
	Following                // applying changes as they arrive, as a heartbeat sent less than the max lag ago proved
	Behind                   // the last heartbeat back was sent more than the max lag ago; lookups pass through
)

func (s State) String() string {
	switch s {
	case Resyncing:
		return "resyncing"
	case Following:
		return "following"
	case Behind:
		return "behind"
	default:
		return "pass-through"
	}
}

// Target is what a follower keeps in step with a table: a
// *guarded.Loader[K, V] of any value type V. The follower attaches itself
// as the Target's change feed ([guarded.Feed]) at the start of its Run,
// from Run's goroutine, reads the table into a fresh guard through it (or
// installs a guard it saved), applies each change after that, and
// invalidates the Target (every lookup passes through) whenever it cannot
// know what it misses; it detaches the Feed when Run returns. The Feed,
// not the Target, must be safe for concurrent use with the Target's
// lookups, as guarded.Feed is.
type Target[K comparable] interface {
	AttachFeed() (*guarded.Feed[K], error)
}
