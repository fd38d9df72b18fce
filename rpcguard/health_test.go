package rpcguard_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/rpcguard"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb/testpbconnect"
)

// TestHealthFollowsReadiness runs a Health against the health service
// of a gRPC and of a Connect server, and follows the status from another
// client on a connection of its own, as a probe would: NOT_SERVING while
// the Loader is not ready (unknown ids reach the handler), SERVING once it
// is filled (unknown ids get the guard's NotFound), NOT_SERVING again when
// it is invalidated, SERVING when it is ready again.
func TestHealthFollowsReadiness(t *testing.T) {
	const (
		serving    = healthpb.HealthCheckResponse_SERVING
		notServing = healthpb.HealthCheckResponse_NOT_SERVING
	)
	for _, transport := range transports {
		t.Run("transport="+transport, func(t *testing.T) {
			s := newStore(100)
			e := guardedServer(t, transport, s, false)
			ctx := testCtx(t)
			h, err := rpcguard.NewHealth(e.loader, e.setter,
				rpcguard.WithServices("", testpbconnect.UsersName), rpcguard.WithPollInterval(time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			// NewHealth set the status before it returned: checked now,
			// before Run.
			check(t, e, healthpb.HealthCheckResponse_NOT_SERVING)
			rctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- h.Run(rctx) }()
			defer func() {
				stop()
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Errorf("Run returned %v, want context.Canceled", err)
				}
			}()
			watch, err := e.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: testpbconnect.UsersName})
			if err != nil {
				t.Fatal(err)
			}
			// await reads the Watch stream until it reports want. A status
			// the stream never reports fails the test at the context's
			// deadline.
			await := func(want healthpb.HealthCheckResponse_ServingStatus) {
				t.Helper()
				for {
					resp, err := watch.Recv()
					if err != nil {
						t.Fatalf("waiting for %v: %v", want, err)
					}
					if resp.GetStatus() == want {
						return
					}
				}
			}
			// guarded reports whether an unknown id gets the guard's
			// NotFound, and checks that it gets a NotFound.
			guarded := func() bool {
				t.Helper()
				_, err := e.client.GetUser(ctx, unknownID)
				if code(err) != codes.NotFound {
					t.Fatalf("GetUser(unknown) = %v, want NotFound", err)
				}
				return rpcguard.FromGuard(err)
			}

			await(notServing)
			check(t, e, notServing)
			if guarded() {
				t.Fatal("not ready, and the guard answered")
			}
			fill(t, e.loader, s)
			await(serving)
			check(t, e, serving)
			if !guarded() {
				t.Fatal("serving, and the handler answered")
			}
			e.loader.Invalidate() // as a follower does when it loses its stream
			await(notServing)
			check(t, e, notServing)
			if guarded() {
				t.Fatal("invalidated, and the guard answered")
			}
			e.loader.MarkReady()
			await(serving)
			check(t, e, serving)
		})
	}
}

// check checks the status of the server and of its Users service, through
// the health client.
func check(t *testing.T, e env, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for _, svc := range []string{"", testpbconnect.UsersName} {
		resp, err := e.health.Check(testCtx(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != want {
			t.Fatalf("Check(%q) = %v, %v; want %v", svc, resp.GetStatus(), err, want)
		}
	}
}

// fakeSetter records the statuses a Health sets.
type fakeSetter chan [2]string

func (f fakeSetter) SetServingStatus(svc string, st healthpb.HealthCheckResponse_ServingStatus) {
	f <- [2]string{svc, st.String()}
}

// TestHealthSetsOnChange: NewHealth sets every service at once, and Run
// only when readiness changes.
func TestHealthSetsOnChange(t *testing.T) {
	ready := make(chan bool, 1)
	ready <- false
	cur := false
	r := rpcguard.ReadyFunc(func() bool {
		select {
		case cur = <-ready:
		default:
		}
		return cur
	})
	set := make(fakeSetter, 16)
	next := func(want [2]string) {
		t.Helper()
		if got := <-set; got != want {
			t.Fatalf("set %v, want %v", got, want)
		}
	}
	h, err := rpcguard.NewHealth(r, set, rpcguard.WithServices("a", "b"), rpcguard.WithPollInterval(time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	if len(set) != 2 {
		t.Fatalf("NewHealth set %d statuses before it returned, want 2", len(set))
	}
	next([2]string{"a", "NOT_SERVING"})
	next([2]string{"b", "NOT_SERVING"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	ready <- true
	next([2]string{"a", "SERVING"})
	next([2]string{"b", "SERVING"})
	// Run runs: another returns at once.
	if err := h.Run(ctx); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("a second Run returned %v, want an error at once", err)
	}
	ready <- false
	next([2]string{"a", "NOT_SERVING"})
	next([2]string{"b", "NOT_SERVING"})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v, want context.Canceled", err)
	}
	// Polled all along, readiness unchanged: nothing more was set.
	select {
	case got := <-set:
		t.Fatalf("set %v after the last change", got)
	default:
	}
}

func TestNewHealthRefuses(t *testing.T) {
	r := rpcguard.ReadyFunc(func() bool { return true })
	s := rpcguard.StatusSetterFunc(func(string, healthpb.HealthCheckResponse_ServingStatus) {})
	var nilReadier rpcguard.ReadyFunc
	for _, tc := range []struct {
		name string
		r    rpcguard.Readier
		s    rpcguard.StatusSetter
		opts []rpcguard.HealthOption
	}{
		{"nil readier", nil, s, nil},
		{"nil ReadyFunc", nilReadier, s, nil},
		{"nil setter", r, nil, nil},
		{"no services", r, s, []rpcguard.HealthOption{rpcguard.WithServices()}},
		{"zero interval", r, s, []rpcguard.HealthOption{rpcguard.WithPollInterval(0)}},
		{"negative interval", r, s, []rpcguard.HealthOption{rpcguard.WithPollInterval(-time.Second)}},
		{"nil option", r, s, []rpcguard.HealthOption{nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := rpcguard.NewHealth(tc.r, tc.s, tc.opts...)
			if err == nil {
				t.Fatalf("NewHealth = %v, no error", h)
			}
			t.Log(err)
		})
	}
	h, err := rpcguard.NewHealth(r, s)
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 a nil ctx is what this checks
	if err := h.Run(nil); err == nil {
		t.Error("Run(nil): no error")
	}
}

// grpc's health server is a StatusSetter as it is.
var _ rpcguard.StatusSetter = (*health.Server)(nil)

// TestHealthServerChecksAtCall: Health.Server answers Check from the
// Loader's readiness at the moment of the call, not from the status Run
// last set: a lease that ran out while nothing ran (a paused process) is
// NOT_SERVING at once, with no Run at all.
func TestHealthServerChecksAtCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, feed := fedLoader(t, func(context.Context, int64) (string, error) { return "", guarded.ErrNotFound })
		feed.ReadyUntil(time.Now().Add(150 * time.Millisecond))
		hs := health.NewServer()
		h, err := rpcguard.NewHealth(l, hs, rpcguard.WithServices("", testpbconnect.UsersName))
		if err != nil {
			t.Fatal(err)
		}
		srv := h.Server(hs)
		ctx := context.Background()
		status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
			t.Helper()
			resp, err := srv.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				t.Fatalf("Check(%q): %v", svc, err)
			}
			return resp.GetStatus()
		}
		for _, svc := range []string{"", testpbconnect.UsersName} {
			if got := status(svc); got != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("Check(%q) under the lease = %v, want SERVING", svc, got)
			}
		}
		hs.SetServingStatus("other", healthpb.HealthCheckResponse_SERVING)
		time.Sleep(150 * time.Millisecond) // the lease runs out; Run never runs
		for _, svc := range []string{"", testpbconnect.UsersName} {
			if got := status(svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Fatalf("Check(%q) after the lease ran out = %v, want NOT_SERVING (the health server still says %v)", svc, got, healthStatus(t, hs, svc))
			}
		}
		if got := status("other"); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check of a service the Health does not own = %v, want the inner server's SERVING", got)
		}
		feed.ReadyUntil(time.Now().Add(150 * time.Millisecond))
		if got := status(""); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check under a new lease = %v, want SERVING", got)
		}
	})
}

// healthStatus is what hs itself answers for svc.
func healthStatus(t *testing.T, hs *health.Server, svc string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatus()
}
