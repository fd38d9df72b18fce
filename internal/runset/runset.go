// Package runset runs what one replica of a guarded service runs — each
// table's follower, and the relay's campaign — and answers for it as a
// whole: readiness (Ready, and /readyz through ServeHTTP) and Close.
// pgguard and mysqlguard build their Service on it.
package runset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
)

// A Member is one table's part of a Set: what runs it, what says whether
// its Loader answers on its own, and what closes it.
type Member struct {
	Name  string
	State func() (ready bool, why string) // why: why it is not ready
	Run   func(context.Context) error
	Close func() error
}

// A Set is a replica's members, and the runs of its own (the relay's)
// beside them. It is safe for concurrent use once Start has returned.
type Set struct {
	what    string // the package, for its log lines: "pgguard"
	log     *slog.Logger
	members []Member

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	mu        sync.Mutex // protects fatal
	fatal     map[string]error
}

// New returns an empty Set of the package what, logging to log.
func New(what string, log *slog.Logger) *Set {
	return &Set{what: what, log: log, fatal: map[string]error{}}
}

// Add adds m, before Start.
func (s *Set) Add(m Member) { s.members = append(s.members, m) }

// Start runs each member's Run, and each of runs (by name), in goroutines
// that Close stops. A run that returns an error before Close (a setup that
// cannot work) is logged, and named by ServeHTTP from then on.
func (s *Set) Start(runs map[string]func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for name, run := range runs {
		s.goRun(ctx, name, run)
	}
	for _, m := range s.members {
		s.goRun(ctx, m.Name, m.Run)
	}
}

func (s *Set) goRun(ctx context.Context, what string, run func(context.Context) error) {
	s.wg.Go(func() {
		if err := run(ctx); err != nil && ctx.Err() == nil {
			s.log.LogAttrs(ctx, slog.LevelError, "cuckooguard: "+s.what+": cannot follow", slog.String("what", what), slog.Any("error", err))
			s.mu.Lock()
			s.fatal[what] = err
			s.mu.Unlock()
		}
	})
}

// Ready reports whether every member is ready.
func (s *Set) Ready() bool {
	for _, m := range s.members {
		if ready, _ := m.State(); !ready {
			return false
		}
	}
	return true
}

// ServeHTTP answers a readiness probe: 200 "ready" while Ready, else 503
// with a line per run that failed and per member that is not ready,
// naming it and why.
func (s *Set) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	var why []string
	s.mu.Lock()
	for what, err := range s.fatal {
		why = append(why, fmt.Sprintf("%s: cannot follow: %v", what, err))
	}
	s.mu.Unlock()
	for _, m := range s.members {
		if ready, w := m.State(); !ready {
			why = append(why, m.Name+": "+w)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if len(why) == 0 {
		w.WriteHeader(http.StatusOK)
		fmt.Fprintln(w, "ready")
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintln(w, strings.Join(why, "\n"))
}

// Close stops the runs and waits for them, then closes the members. It is
// idempotent; before Start it only closes the members.
func (s *Set) Close() error {
	var err error
	s.closeOnce.Do(func() {
		if s.cancel != nil {
			s.cancel()
		}
		s.wg.Wait()
		var errs []error
		for _, m := range s.members {
			errs = append(errs, m.Close())
		}
		err = errors.Join(errs...)
	})
	return err
}
