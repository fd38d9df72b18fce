package rpcguard_test

import (
	"testing"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/middleware"
	"github.com/cuckooguard/cuckooguard/rpcguard"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	getUser   = testpb.Users_GetUser_FullMethodName
	getByName = testpb.Users_GetByName_FullMethodName
	watchUser = testpb.Users_WatchUser_FullMethodName
	rename    = testpb.Users_Rename_FullMethodName
	unknownID = 999_999
)

// env is a guarded Users service.
type env struct {
	*server
	loader *guarded.Loader[int64, string]
	ids    *rpcguard.Interceptor[int64]  // guards GetUser, WatchUser and Rename by id, with loader
	names  *rpcguard.Interceptor[string] // guards GetByName, with a bare guard of the names
}

// guardedServer starts the Users service over transport, with the users
// of s, guarded by an Interceptor over a Loader (by id), filled if filled,
// and one over a bare guard of the names (GetByName).
func guardedServer(t *testing.T, transport string, s *store, filled bool) env {
	t.Helper()
	loader := newLoader(t, s, filled)
	ids, err := rpcguard.New(loader, rpcguard.Keys[int64]{
		getUser:   rpcguard.Field[int64]("id"),
		watchUser: rpcguard.Field[int64]("id"),
		rename: rpcguard.Func(func(r *testpb.RenameRequest) (int64, bool) {
			return r.GetId(), r.GetId() != 0
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	s.mu.RLock()
	for _, name := range s.names {
		if err := g.AddString(name); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.RUnlock()
	names, err := rpcguard.New(middleware.GuardFilter(g), rpcguard.Keys[string]{getByName: rpcguard.Field[string]("name")},
		rpcguard.WithMessage("user not found"))
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, transport, &service{s: s, loader: loader}, serverConfig{
		unary:   []grpc.UnaryServerInterceptor{ids.Unary(), names.Unary()},
		stream:  []grpc.StreamServerInterceptor{ids.Stream(), names.Stream()},
		connect: []connect.Interceptor{ids, names},
	})
	return env{server: srv, loader: loader, ids: ids, names: names}
}

// TestGuard calls every kind of guarded method over real loopback TCP,
// through a gRPC server and a Connect server: unknown keys get NotFound
// from the guard without the handler, known keys reach it, and the
// counters say so.
func TestGuard(t *testing.T) {
	for _, transport := range transports {
		t.Run("transport="+transport, func(t *testing.T) {
			s := newStore(100)
			e := guardedServer(t, transport, s, true)
			c := e.client
			ctx := testCtx(t)

			type call struct {
				name    string
				method  string // whose handler runs, if it runs
				do      func() error
				handler bool       // whether the handler runs
				code    codes.Code // of the answer
				guard   bool       // whether FromGuard says the guard answered
			}
			calls := []call{
				{"known id", "GetUser", func() error {
					u, err := c.GetUser(ctx, 42)
					if err == nil && u.GetName() != "user 42" {
						t.Errorf("GetUser(42) = %v, want user 42", u)
					}
					return err
				}, true, codes.OK, false},
				{"unknown id", "GetUser", func() error { _, err := c.GetUser(ctx, unknownID); return err }, false, codes.NotFound, true},
				{"id 0 is a missing key", "GetUser", func() error { _, err := c.GetUser(ctx, 0); return err }, true, codes.NotFound, false},
				{"known name", "GetByName", func() error { _, err := c.GetByName(ctx, "user 7"); return err }, true, codes.OK, false},
				{"unknown name", "GetByName", func() error { _, err := c.GetByName(ctx, "nobody"); return err }, false, codes.NotFound, true},
				{"stream of a known id", "WatchUser", func() error {
					us, err := c.WatchUser(ctx, 42)
					if err == nil && (len(us) != 1 || us[0].GetId() != 42) {
						t.Errorf("WatchUser(42) sent %v, want user 42", us)
					}
					return err
				}, true, codes.OK, false},
				{"stream of an unknown id", "WatchUser", func() error { _, err := c.WatchUser(ctx, unknownID); return err }, false, codes.NotFound, true},
				{"client stream, known id first", "Rename", func() error {
					u, err := c.Rename(ctx, &testpb.RenameRequest{Id: 42, Name: "Ada"}, &testpb.RenameRequest{Name: "Grace"})
					if err == nil && (u.GetId() != 42 || u.GetName() != "Grace") {
						t.Errorf("Rename(42) = %v, want 42 Grace", u)
					}
					return err
				}, true, codes.OK, false},
				{"client stream, unknown id first", "Rename", func() error {
					_, err := c.Rename(ctx, &testpb.RenameRequest{Id: unknownID, Name: "Ada"}, &testpb.RenameRequest{Name: "Grace"})
					return err
				}, false, codes.NotFound, true},
				{"client stream without a message", "Rename", func() error { _, err := c.Rename(ctx); return err }, true, codes.InvalidArgument, false},
				{"method not guarded", "Ping", func() error { return c.Ping(ctx) }, true, codes.OK, false},
			}
			for _, cl := range calls {
				before := s.callsOf(cl.method)
				err := cl.do()
				if got := code(err); got != cl.code {
					t.Errorf("%s: code %v (%v), want %v", cl.name, got, err, cl.code)
				}
				if got := rpcguard.FromGuard(err); got != cl.guard {
					t.Errorf("%s: FromGuard(%v) = %v, want %v", cl.name, err, got, cl.guard)
				}
				if ran := s.callsOf(cl.method) > before; ran != cl.handler {
					t.Errorf("%s: the handler ran: %v, want %v", cl.name, ran, cl.handler)
				}
			}

			// The calls above, as the interceptors counted them. Each
			// counts the other's methods in Unfiltered, and Ping.
			want := rpcguard.Stats{Methods: map[string]rpcguard.MethodStats{
				getUser:   {Rejected: 1, Passed: 1, MissingKey: 1},
				watchUser: {Rejected: 1, Passed: 1},
				rename:    {Rejected: 1, Passed: 1, MissingKey: 1},
			}, Unfiltered: 3}
			checkStats(t, "ids", e.ids.Stats(), want)
			checkStats(t, "names", e.names.Stats(), rpcguard.Stats{Methods: map[string]rpcguard.MethodStats{
				getByName: {Rejected: 1, Passed: 1},
			}, Unfiltered: 6}) // Ping, and the five requests of the ids' methods that the first interceptor passed
		})
	}
}

func checkStats(t *testing.T, name string, got, want rpcguard.Stats) {
	t.Helper()
	if got.Unfiltered != want.Unfiltered {
		t.Errorf("%s: Unfiltered = %d, want %d", name, got.Unfiltered, want.Unfiltered)
	}
	if len(got.Methods) != len(want.Methods) {
		t.Errorf("%s: %d methods, want %d", name, len(got.Methods), len(want.Methods))
	}
	for m, w := range want.Methods {
		if g := got.Methods[m]; g != w {
			t.Errorf("%s: %s = %+v, want %+v", name, m, g, w)
		}
	}
}

// TestFalsePositive: a key the guard lets through and the handler answers
// NotFound for counts as an observed false positive.
func TestFalsePositive(t *testing.T) {
	for _, transport := range transports {
		t.Run("transport="+transport, func(t *testing.T) {
			s := newStore(100)
			e := guardedServer(t, transport, s, true)
			// Another writer deletes a row behind the Loader's back:
			// the guard still has the id.
			s.mu.Lock()
			delete(s.names, 50)
			s.mu.Unlock()
			ctx := testCtx(t)
			for _, call := range []func() error{
				func() error { _, err := e.client.GetUser(ctx, 50); return err },
				func() error { _, err := e.client.WatchUser(ctx, 50); return err },
				func() error { _, err := e.client.Rename(ctx, &testpb.RenameRequest{Id: 50}); return err },
			} {
				if err := call(); code(err) != codes.NotFound || rpcguard.FromGuard(err) {
					t.Errorf("deleted id 50: %v, want the handler's NotFound", err)
				}
			}
			checkStats(t, "ids", e.ids.Stats(), rpcguard.Stats{Methods: map[string]rpcguard.MethodStats{
				getUser:   {Passed: 1, FalsePositives: 1},
				watchUser: {Passed: 1, FalsePositives: 1},
				rename:    {Passed: 1, FalsePositives: 1},
			}})
		})
	}
}

// TestNotReadyPassesEverything: while the Loader is not filled, every
// request reaches the handler, which asks the store; once it is filled,
// unknown ids get the guard's NotFound.
func TestNotReadyPassesEverything(t *testing.T) {
	for _, transport := range transports {
		t.Run("transport="+transport, func(t *testing.T) {
			s := newStore(100)
			e := guardedServer(t, transport, s, false)
			c := e.client
			ctx := testCtx(t)
			unknown := []func() error{
				func() error { _, err := c.GetUser(ctx, unknownID); return err },
				func() error { _, err := c.WatchUser(ctx, unknownID); return err },
				func() error { _, err := c.Rename(ctx, &testpb.RenameRequest{Id: unknownID}); return err },
			}
			for i, call := range unknown {
				err := call()
				if code(err) != codes.NotFound || rpcguard.FromGuard(err) {
					t.Errorf("call %d, not ready: %v, want the handler's NotFound", i, err)
				}
			}
			if _, err := c.GetUser(ctx, 42); err != nil {
				t.Errorf("GetUser(42), not ready: %v", err)
			}
			for _, m := range []string{"GetUser", "WatchUser", "Rename"} {
				if s.callsOf(m) == 0 {
					t.Errorf("%s: the handler did not run while the Loader was not ready", m)
				}
			}
			// Passed, as the middleware counts a request while its Loader
			// warms up, and the handler's NotFound with them.
			checkStats(t, "ids", e.ids.Stats(), rpcguard.Stats{Methods: map[string]rpcguard.MethodStats{
				getUser:   {Passed: 2, FalsePositives: 1},
				watchUser: {Passed: 1, FalsePositives: 1},
				rename:    {Passed: 1, FalsePositives: 1},
			}})

			// Filled: the guard answers.
			fill(t, e.loader, s)
			for i, call := range unknown {
				if err := call(); !rpcguard.FromGuard(err) {
					t.Errorf("call %d, ready: %v, want the guard's NotFound", i, err)
				}
			}
		})
	}
}
