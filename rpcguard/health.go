package rpcguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cuckooguard/cuckooguard/internal/options"
)

// Readier reports whether a service is ready: whether its guard answers
// on its own, so that its lookups of absent keys do not reach the store.
// A *guarded.Loader implements it (filled, or caught up, and not
// invalidated by its follower); [ReadyFunc] adapts a function that adds
// other conditions, such as the follower's state, as /readyz does:
//
//	rpcguard.ReadyFunc(func() bool {
//		return loader.Ready() && follower.Stats().State == postgres.Following
//	})
type Readier interface {
	Ready() bool
}

// ReadyFunc adapts a function to a [Readier].
type ReadyFunc func() bool

// Ready returns f().
func (f ReadyFunc) Ready() bool { return f() }

// StatusSetter sets the grpc.health.v1 serving status of a service. The
// health server of gRPC, *health.Server of google.golang.org/grpc/health,
// implements it. For Connect, adapt a grpchealth.StaticChecker
// (connectrpc.com/grpchealth), whose statuses have the same numbers:
//
//	checker := grpchealth.NewStaticChecker()
//	setter := rpcguard.StatusSetterFunc(func(service string, st healthpb.HealthCheckResponse_ServingStatus) {
//		checker.SetStatus(service, grpchealth.Status(st))
//	})
type StatusSetter interface {
	SetServingStatus(service string, status healthpb.HealthCheckResponse_ServingStatus)
}

// StatusSetterFunc adapts a function to a [StatusSetter].
type StatusSetterFunc func(service string, status healthpb.HealthCheckResponse_ServingStatus)

// SetServingStatus calls f(service, status).
func (f StatusSetterFunc) SetServingStatus(service string, status healthpb.HealthCheckResponse_ServingStatus) {
	f(service, status)
}

// DefaultPollInterval is how often [Health.Run] asks the Readier unless
// [WithPollInterval] sets another interval.
const DefaultPollInterval = 250 * time.Millisecond

// HealthOption configures a [Health] made by [NewHealth].
type HealthOption func(*healthConfig)

type healthConfig struct {
	services []string
	interval time.Duration
}

// WithServices sets the services whose status a Health sets: the full
// names of protobuf services ("package.Service"), and "" for the server as
// a whole. The default is "" alone, the service that a health check names
// when it names none, as a Kubernetes gRPC probe does unless its service
// field is set.
func WithServices(names ...string) HealthOption {
	return func(c *healthConfig) { c.services = names }
}

// WithPollInterval sets how often [Health.Run] asks the Readier, a
// positive duration; a change of readiness reaches the health status
// within it. The default is [DefaultPollInterval]. Each poll costs one
// call of Ready.
func WithPollInterval(d time.Duration) HealthOption {
	return func(c *healthConfig) { c.interval = d }
}

// Health keeps the grpc.health.v1 status of services at SERVING while a
// [Readier] reports ready and at NOT_SERVING while it does not, so that a
// health check (a Kubernetes gRPC readiness probe, a load balancer's
// health check) takes a replica whose lookups would all reach the store
// out of rotation, as /readyz does over HTTP. A replica that is not ready
// still answers correctly: its guard passes every lookup to the store.
//
// A Health is safe for concurrent use by multiple goroutines. Use
// [NewHealth] to make one.
type Health struct {
	r       Readier
	s       StatusSetter
	cfg     healthConfig
	ready   atomic.Bool // the readiness last set
	running atomic.Bool // Run has been called
}

// NewHealth sets the status of the services in s from r at once, before it
// returns, and returns a Health whose [Health.Run] keeps it set. Make it
// before the server serves: grpc's health.Server answers SERVING for ""
// until told otherwise, and a probe must not see a replica serving before
// its guard is ready.
//
//	hs := health.NewServer()
//	h, err := rpcguard.NewHealth(users, hs) // NOT_SERVING until users is ready
//	if err != nil {
//		return err
//	}
//	go h.Run(ctx)
//	healthpb.RegisterHealthServer(srv, h.Server(hs)) // Check asks users at the call
func NewHealth(r Readier, s StatusSetter, opts ...HealthOption) (*Health, error) {
	switch {
	case isNil(r):
		return nil, errors.New("rpcguard: NewHealth: the Readier is nil")
	case isNil(s):
		return nil, errors.New("rpcguard: NewHealth: the StatusSetter is nil")
	}
	c := healthConfig{services: []string{""}, interval: DefaultPollInterval}
	if err := options.Apply("rpcguard: NewHealth", &c, opts); err != nil {
		return nil, err
	}
	if len(c.services) == 0 {
		return nil, errors.New("rpcguard: NewHealth: WithServices names no service")
	}
	if c.interval <= 0 {
		return nil, fmt.Errorf("rpcguard: NewHealth: poll interval %v, want a positive duration", c.interval)
	}
	h := &Health{r: r, s: s, cfg: c}
	h.set(r.Ready())
	return h, nil
}

// set sets every service's status from ready.
func (h *Health) set(ready bool) {
	h.ready.Store(ready)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range h.cfg.services {
		h.s.SetServingStatus(svc, st)
	}
}

// Run asks the Readier every poll interval ([WithPollInterval]) and sets
// the status again when readiness has changed since it was last set. It
// runs until ctx ends, then returns ctx.Err() and leaves the status as it
// last set it; it returns an error at once if another Run has been
// called. The Health owns the status of its services: to take the server
// out of rotation when it shuts down, call the health server's Shutdown
// (which grpc's health.Server keeps over later updates), or fold the
// shutdown into the Readier.
func (h *Health) Run(ctx context.Context) error {
	if ctx == nil {
		return errors.New("rpcguard: Health.Run: ctx is nil")
	}
	if !h.running.CompareAndSwap(false, true) {
		return errors.New("rpcguard: Health.Run: called twice")
	}
	t := time.NewTicker(h.cfg.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if now := h.r.Ready(); now != h.ready.Load() {
				h.set(now)
			}
		}
	}
}

// Server returns a grpc.health.v1 server that answers Check for the
// Health's services by asking the Readier at the moment of the call:
// NOT_SERVING while it is not ready, and inner's answer while it is (inner
// may say NOT_SERVING for its own reasons, such as a shutdown). Register
// it in inner's place. Without it a Check is answered from the status
// [Health.Run] last set, up to a poll interval old, and a process that
// wakes from a pause (SIGSTOP, a frozen host) would answer SERVING from
// before the pause until Run's goroutine runs; a Loader's readiness under
// a follower is a lease that has run out by then (guarded.Feed.ReadyUntil).
// Watch, List, and Check of other services are inner's: a Watch stream
// hears a change when Run sets it.
//
//	hs := health.NewServer()
//	h, err := rpcguard.NewHealth(users, hs)
//	...
//	go h.Run(ctx)
//	healthpb.RegisterHealthServer(srv, h.Server(hs))
//
// For Connect, answer grpchealth's Check the same way: a Checker that
// returns StatusNotServing unless the Readier is ready, and asks a
// grpchealth.StaticChecker otherwise.
func (h *Health) Server(inner healthpb.HealthServer) healthpb.HealthServer {
	return checkedHealth{HealthServer: inner, h: h}
}

// checkedHealth is [Health.Server]'s server.
type checkedHealth struct {
	healthpb.HealthServer // List, Watch, other services, and Check while ready
	h                     *Health
}

// Check answers NOT_SERVING for a service of the Health whose Readier is
// not ready now, and asks the inner server otherwise.
func (c checkedHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if slices.Contains(c.h.cfg.services, req.GetService()) && !c.h.r.Ready() {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	return c.HealthServer.Check(ctx, req)
}
