package mysql

import (
	"fmt"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// The server writes a transaction to the binlog, and its binlog readers
// may have it, before the engine commits it: other sessions see the
// transaction only then (under semi-synchronous replication with
// AFTER_SYNC, only once a replica has acknowledged it). A deletion applied
// when the binlog carries it would make its key read absent while every
// query still finds the row. So a deletion waits until a heartbeat the
// binlog carries after it has been written, its statement returned:
// MariaDB's group commit commits transactions in the engine in binlog
// order (commit_ordered), and a statement returns once its transaction is
// visible, so every transaction before the heartbeat in the binlog is
// visible then. (MySQL does so only with binlog_order_commits on, its
// default; MySQL is not supported yet, and would need that checked.) Creations are applied at once (early: a false positive). The
// lease ([Follower.grant]) is about creations only: a held deletion is a
// false positive for a heartbeat or so.
//
// A creation of a key that has a deletion held cancels that deletion
// instead of adding a copy: a key deleted and created again within a
// heartbeat, over and over, would otherwise pile up copies, and past
// guard.MaxCopies (4) the Loader takes an add as present already and
// drops it, while every held deletion is applied later: the key then
// reads absent with its row there. (TestChurnDuringWrites found 1,686
// such wrong 404s in 3 s before this.) Cancelled, the copy of the deleted
// version stands for the new one: while the deletion is not visible the
// old row is, after it the new one is (or its creation is not visible
// yet: a false positive).
//
// Held deletions belong to the session's guard: a session that ends drops
// them, and the next one reads the table into a fresh guard.

// hold holds the deletions of a committed transaction.
func (s *session[K]) hold(deletions []K) {
	for _, k := range deletions {
		s.pending[k]++
	}
	s.held = append(s.held, deletions...)
}

// create applies a committed creation of k: it cancels a held deletion of
// k if there is one, and adds k otherwise.
func (s *session[K]) create(k K) error {
	if s.pending[k] > 0 {
		if s.pending[k]--; s.pending[k] == 0 {
			delete(s.pending, k)
		}
		s.cancelled[k]++
		return nil
	}
	if err := s.f.feed.Apply(guarded.Change[K]{Key: k}); err != nil {
		return fmt.Errorf("mysql: apply: %w", err)
	}
	s.f.applied.Add(1)
	return nil
}

// mark says that this session's marker (seq 0) or heartbeat seq came back
// in the binlog after held[:upto].
type mark struct {
	seq  int64
	upto int
}

// release applies the held deletions that the server has made visible:
// those before a marker or heartbeat back whose write has returned.
func (s *session[K]) release() error {
	acked := s.acked.Load()
	n := 0
	for len(s.marks) > 0 && s.marks[0].seq <= acked {
		n = s.marks[0].upto
		s.marks = s.marks[1:]
	}
	if n == 0 {
		return nil
	}
	for _, k := range s.held[:n] {
		if s.cancelled[k] > 0 {
			// A later creation kept this deletion's copy.
			if s.cancelled[k]--; s.cancelled[k] == 0 {
				delete(s.cancelled, k)
			}
			continue
		}
		if s.pending[k]--; s.pending[k] == 0 {
			delete(s.pending, k)
		}
		if err := s.f.feed.Apply(guarded.Change[K]{Key: k, Deleted: true}); err != nil {
			return fmt.Errorf("mysql: apply: %w", err)
		}
		s.f.applied.Add(1)
	}
	clear(s.held[:n])
	s.held = s.held[n:]
	for i := range s.marks {
		s.marks[i].upto -= n
	}
	return nil
}
