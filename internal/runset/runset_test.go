package runset

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSet: readiness names each member that is not ready and each run
// that failed; Close stops every run, closes each member once, and is
// idempotent.
func TestSet(t *testing.T) {
	s := New("test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	var ready atomic.Bool
	var closed atomic.Int32
	stopped := make(chan struct{})
	s.Add(Member{Name: "orders",
		State: func() (bool, string) { return ready.Load(), "follower resyncing" },
		Run: func(ctx context.Context) error {
			<-ctx.Done()
			close(stopped)
			return ctx.Err()
		},
		Close: func() error { closed.Add(1); return nil }})
	failed := make(chan struct{})
	s.Start(map[string]func(context.Context) error{"relay": func(context.Context) error {
		defer close(failed)
		return errors.New("the table is not published")
	}})
	<-failed
	probe := func() (int, string) {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
		return w.Code, w.Body.String()
	}
	// The failed run is recorded once its goroutine has returned.
	for code, body := probe(); !strings.Contains(body, "relay: cannot follow"); code, body = probe() {
		if code != 503 {
			t.Fatalf("/readyz = %d %q while not ready", code, body)
		}
	}
	code, body := probe()
	if code != 503 || !strings.Contains(body, "orders: follower resyncing") || !strings.Contains(body, "relay: cannot follow: the table is not published") || s.Ready() {
		t.Fatalf("/readyz = %d %q, Ready %v; want 503 naming orders and the relay", code, body, s.Ready())
	}
	ready.Store(true)
	if !s.Ready() {
		t.Fatal("Ready is false with every member ready")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	<-stopped
	if err := s.Close(); err != nil || closed.Load() != 1 {
		t.Fatalf("a second Close = %v, members closed %d times; want nil, once", err, closed.Load())
	}
}
