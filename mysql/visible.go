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
// Held deletions belong to the guard, not to the session: a session that
// ends leaves them held, and the next one, which resumes where it stopped
// (resume.go), releases them once its own marker is back (the marker is
// in the binlog after every one of them). A full read drops them: its
// fresh guard is read after they became visible, or its stream brings
// them again. The snapshot file saves them with the guard (save.go).

// holdings are the deletions held until visible, and how creations since
// have cancelled them. Touched by Run's goroutine only.
type holdings[K comparable] struct {
	held      []K       // deletions applied to no guard yet, in binlog order
	pending   map[K]int // of held, by key: those no creation has cancelled
	cancelled map[K]int // of held, by key: those a later creation cancelled
}

// drop forgets every held deletion: the guard they were held for is
// replaced.
func (h *holdings[K]) drop() {
	clear(h.held)
	h.held = h.held[:0]
	h.pending = make(map[K]int)
	h.cancelled = make(map[K]int)
}

// hold holds the deletions of a committed transaction.
func (h *holdings[K]) hold(deletions []K) {
	for _, k := range deletions {
		h.pending[k]++
	}
	h.held = append(h.held, deletions...)
}

// cancel cancels one held deletion of k, if there is one: the next held
// deletion of k that is released removes nothing.
func (h *holdings[K]) cancel(k K) bool {
	if h.pending[k] == 0 {
		return false
	}
	if h.pending[k]--; h.pending[k] == 0 {
		delete(h.pending, k)
	}
	h.cancelled[k]++
	return true
}

// uncancelled returns the held deletions no creation has cancelled, in
// binlog order: what releasing every held deletion would remove.
func (h *holdings[K]) uncancelled() []K {
	skip := make(map[K]int, len(h.cancelled))
	for k, n := range h.cancelled {
		skip[k] = n
	}
	var out []K
	for _, k := range h.held {
		if skip[k] > 0 {
			skip[k]--
			continue
		}
		out = append(out, k)
	}
	return out
}

// create applies a committed creation of k: it cancels a held deletion of
// k if there is one, and adds k otherwise.
func (s *session[K]) create(k K) error {
	if s.f.holds.cancel(k) {
		return nil
	}
	return s.apply(guarded.Change[K]{Key: k})
}

// apply applies one change to the Loader. A change the Loader refuses
// leaves the guard between two positions of the binlog: the next session
// cannot resume, and reads the table.
func (s *session[K]) apply(c guarded.Change[K]) error {
	if err := s.f.feed.Apply(c); err != nil {
		s.f.resume = nil
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
	h := &s.f.holds
	for _, k := range h.held[:n] {
		if h.cancelled[k] > 0 {
			// A later creation kept this deletion's copy.
			if h.cancelled[k]--; h.cancelled[k] == 0 {
				delete(h.cancelled, k)
			}
			continue
		}
		if h.pending[k]--; h.pending[k] == 0 {
			delete(h.pending, k)
		}
		if err := s.apply(guarded.Change[K]{Key: k, Deleted: true}); err != nil {
			return err
		}
	}
	clear(h.held[:n])
	h.held = h.held[n:]
	for i := range s.marks {
		s.marks[i].upto -= n
	}
	return nil
}
