package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cuckooguard/cuckooguard/examples/grpcapi/usersv1"
	"github.com/cuckooguard/cuckooguard/examples/internal/pgtest"
	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
	"github.com/cuckooguard/cuckooguard/rpcguard"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// served is an app serving gRPC on a loopback port, with a client and a
// health client, each on a connection of its own.
type served struct {
	a      *app
	addr   string
	users  usersv1.UserServiceClient
	health healthpb.HealthClient
}

// serveApp serves an app with cfg over loopback TCP, its warm-up (or
// follower) running, until the end of the test.
func serveApp(t *testing.T, cfg config) *served {
	t.Helper()
	ctx := context.Background()
	a, err := newApp(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		a.shutdown(ctx)
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	warmErr := make(chan error, 1)
	go func() { warmErr <- a.warmUp(wctx) }()
	serveErr := make(chan error, 1)
	go func() { serveErr <- a.serve(ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-warmErr; err != nil {
			t.Errorf("warm-up: %v", err)
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		a.shutdown(sctx)
		if err := <-serveErr; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	s := &served{a: a, addr: ln.Addr().String()}
	s.users = usersv1.NewUserServiceClient(conn(t, s.addr))
	s.health = healthpb.NewHealthClient(conn(t, s.addr))
	return s
}

func conn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// watcher follows the health status of the users service through a Watch
// stream.
type watcher struct {
	t      *testing.T
	stream grpc.ServerStreamingClient[healthpb.HealthCheckResponse]
}

func watch(t *testing.T, ctx context.Context, s *served) *watcher {
	t.Helper()
	stream, err := s.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: usersv1.UserService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	return &watcher{t: t, stream: stream}
}

// await reads the stream until it reports want, and returns how long that
// took; a status that never comes fails the test at the context's
// deadline.
func (w *watcher) await(want healthpb.HealthCheckResponse_ServingStatus) time.Duration {
	w.t.Helper()
	start := time.Now()
	for {
		resp, err := w.stream.Recv()
		if err != nil {
			w.t.Fatalf("waiting for %v: %v", want, err)
		}
		if resp.GetStatus() == want {
			return time.Since(start)
		}
	}
}

// guardNotFound fails the test unless err is the service's NotFound,
// detail for detail the handler's own (userNotFound), and no query ran
// since the store had run q: the guard answered, and the client cannot
// tell.
func (s *served) guardNotFound(t *testing.T, what string, q int64, err error) {
	t.Helper()
	if !isUserNotFound(err) || s.a.db.Lookups.Load() != q {
		t.Fatalf("%s = {%v} after %d more queries, want the handler's own NotFound {%v} without a query: the guard's", what, status.Convert(err).Proto(), s.a.db.Lookups.Load()-q, userNotFound.Proto())
	}
}

// isUserNotFound reports whether err is the status userNotFound, with
// the same code, message and details (none).
func isUserNotFound(err error) bool {
	st, ok := status.FromError(err)
	return ok && proto.Equal(st.Proto(), userNotFound.Proto())
}

// TestService calls the service over loopback TCP on SQLite: NOT_SERVING
// turns SERVING once the guard is filled; unknown ids get the guard's
// NotFound without a query, the same status as the handler's own, known
// ids and writes reach the database, and the metrics count it.
func TestService(t *testing.T) {
	s := serveApp(t, config{DSN: filepath.Join(t.TempDir(), "users.db"), Rows: 1000})
	ctx := testCtx(t)
	watch(t, ctx, s).await(healthpb.HealthCheckResponse_SERVING)

	u, err := s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: 42})
	if err != nil || u.GetName() != "user 42" {
		t.Fatalf("GetUser(42) = %v, %v", u, err)
	}
	q := s.a.db.Lookups.Load()
	_, err = s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: 999_999})
	s.guardNotFound(t, "GetUser(unknown)", q, err)
	if _, err := s.users.CreateUser(ctx, &usersv1.CreateUserRequest{Id: 999_999, Name: "Ada"}); err != nil {
		t.Fatal(err)
	}
	if u, err := s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: 999_999}); err != nil || u.GetName() != "Ada" {
		t.Fatalf("GetUser(999999) after CreateUser = %v, %v", u, err)
	}
	if _, err := s.users.CreateUser(ctx, &usersv1.CreateUserRequest{Id: 999_999, Name: "Ada"}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreateUser of a taken id = %v, want AlreadyExists", err)
	}
	if _, err := s.users.DeleteUser(ctx, &usersv1.DeleteUserRequest{Id: 999_999}); err != nil {
		t.Fatal(err)
	}
	q = s.a.db.Lookups.Load()
	_, err = s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: 999_999})
	s.guardNotFound(t, "GetUser after DeleteUser", q, err)
	if _, err := s.users.DeleteUser(ctx, &usersv1.DeleteUserRequest{Id: 999_999}); !isUserNotFound(err) {
		t.Fatalf("DeleteUser of a deleted id = %v, want the handler's NotFound, %v", err, userNotFound.Err())
	}
	g, err := s.users.CreateUser(ctx, &usersv1.CreateUserRequest{Name: "Grace"})
	if err != nil || g.GetId() != 1001 {
		t.Fatalf("CreateUser without an id = %v, %v; want id 1001", g, err)
	}

	rec := httptest.NewRecorder()
	s.a.metricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		`cuckooguard_rpc_requests_total{method="/cuckooguard.examples.users.v1.UserService/GetUser",result="rejected"} 2`,
		`cuckooguard_rpc_requests_total{method="/cuckooguard.examples.users.v1.UserService/GetUser",result="passed"} 2`,
		`cuckooguard_loader_ready 1`,
	} {
		if !strings.Contains(rec.Body.String(), want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestNoGuard: with -noguard every GetUser reaches the database, and the
// handler answers unknown ids.
func TestNoGuard(t *testing.T) {
	s := serveApp(t, config{DSN: filepath.Join(t.TempDir(), "users.db"), Rows: 100, NoGuard: true})
	queries, err := s.getWhenServing(t, 999_999)
	if status.Code(err) != codes.NotFound || rpcguard.FromGuard(err) || queries != 1 {
		t.Fatalf("GetUser(unknown) = %v after %d queries, want the handler's NotFound after one", err, queries)
	}
}

// getWhenServing waits until s is SERVING, then calls GetUser(id); it
// returns the number of queries the call ran, and its error.
func (s *served) getWhenServing(t *testing.T, id int64) (queries int64, err error) {
	t.Helper()
	ctx := testCtx(t)
	watch(t, ctx, s).await(healthpb.HealthCheckResponse_SERVING)
	q := s.a.db.Lookups.Load()
	_, err = s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: id})
	return s.a.db.Lookups.Load() - q, err
}

// TestClient runs the client's commands against a server, as the README
// does.
func TestClient(t *testing.T) {
	s := serveApp(t, config{DSN: filepath.Join(t.TempDir(), "users.db"), Rows: 100})
	for _, tc := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"health", []string{"-wait", "30s"}, "SERVING\n"},
		{"get", []string{"42"}, `{"id":42,"name":"user 42"}` + "\n"},
		{"get", []string{"999"}, "NotFound: user not found\n"}, // the guard's, as the handler's below
		{"create", []string{"-id", "999", "Ada"}, `{"id":999,"name":"Ada"}` + "\n"},
		{"create", []string{"-id", "999", "Ada"}, "AlreadyExists: user 999 exists\n"},
		{"delete", []string{"999"}, "deleted\n"},
		{"delete", []string{"999"}, "NotFound: user not found\n"},
		{"create", []string{"Grace"}, `{"id":101,"name":"Grace"}` + "\n"},
		{"health", []string{"-service", usersv1.UserService_ServiceDesc.ServiceName}, "SERVING\n"},
	} {
		var out bytes.Buffer
		args := append([]string{"-addr", s.addr}, tc.args...)
		if err := clientCmd(tc.cmd, args, &out); err != nil || out.String() != tc.want {
			t.Errorf("%s %q: %q, %v; want %q", tc.cmd, tc.args, out.String(), err, tc.want)
		}
	}
	if err := clientCmd("get", []string{"-addr", s.addr, "x"}, io.Discard); err == nil {
		t.Error("get x: no error")
	}
}

// TestGuardDetail: with -guard-detail the guard's NotFound carries its
// ErrorInfo, which rpcguard.FromGuard reads and the client prints, and the
// handler's does not.
func TestGuardDetail(t *testing.T) {
	s := serveApp(t, config{DSN: filepath.Join(t.TempDir(), "users.db"), Rows: 100, GuardDetail: true})
	queries, err := s.getWhenServing(t, 999)
	if !rpcguard.FromGuard(err) || status.Convert(err).Message() != "user not found" || queries != 0 {
		t.Fatalf("GetUser(unknown) = %v after %d queries, want the guard's NotFound with its ErrorInfo, and no query", err, queries)
	}
	if _, err := s.users.DeleteUser(testCtx(t), &usersv1.DeleteUserRequest{Id: 999}); !isUserNotFound(err) || rpcguard.FromGuard(err) {
		t.Fatalf("DeleteUser(unknown) = %v, want the handler's NotFound, without the ErrorInfo", err)
	}
	var out bytes.Buffer
	const want = "NotFound: user not found (answered by the guard, without the handler)\n"
	if err := clientCmd("get", []string{"-addr", s.addr, "999"}, &out); err != nil || out.String() != want {
		t.Errorf("get 999: %q, %v; want %q", out.String(), err, want)
	}
}

// TestLoadTest runs the load test briefly: both servers answer every
// call as expected, and it prints both side by side.
func TestLoadTest(t *testing.T) {
	var out bytes.Buffer
	if err := loadTestCmd([]string{"-rows", "1000", "-duration", "200ms", "-rounds", "2", "-workers", "2"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"without guard  with guard", "calls/s, median of the rounds", "unknown ids, p50 / p99 (µs)", "answered by the guard"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}

// TestHealthFollowsReplication serves the service as a PostgreSQL
// replica, through a proxy that can take the database away, and follows
// its health status from another client: rows that another client of the
// database writes are found once the follower has them; when the
// database goes away the status turns NOT_SERVING and unknown ids reach
// the database again; a row written meanwhile is found as soon as the
// status is SERVING again.
func TestHealthFollowsReplication(t *testing.T) {
	dsn := pgtest.Schema(t, pgtest.DSN(t))
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	p, err := tcpproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	u.Host = p.Addr()
	s := serveApp(t, config{DSN: u.String(), Rows: 100, Heartbeat: 100 * time.Millisecond})
	ctx := testCtx(t)
	w := watch(t, ctx, s)
	t.Logf("SERVING after %v", w.await(healthpb.HealthCheckResponse_SERVING))
	q := s.a.db.Lookups.Load()
	_, err = s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: 1_000_001})
	s.guardNotFound(t, "GetUser(1000001)", q, err)

	// Another client of the database, not through the service.
	other, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	insert := func(id int64) {
		t.Helper()
		if _, err := other.Exec(ctx, `INSERT INTO users (id, name) VALUES ($1, $2)`, id, "other"); err != nil {
			t.Fatal(err)
		}
	}
	insert(1_000_001)
	start := time.Now()
	for {
		_, err := s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: 1_000_001})
		if err == nil {
			break
		}
		if !isUserNotFound(err) || time.Since(start) > 10*time.Second {
			t.Fatalf("GetUser of a row another client wrote, after %v: %v", time.Since(start), err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("a row another client wrote found after %v", time.Since(start))

	// The database goes away: the follower's connection breaks, new ones
	// are refused.
	p.SetTarget("127.0.0.1:1")
	p.CloseConns()
	t.Logf("NOT_SERVING %v after the database went away", w.await(healthpb.HealthCheckResponse_NOT_SERVING))
	if _, err := s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: 2_000_000}); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetUser(unknown) while NOT_SERVING = %v, want the database's Unavailable, not the guard's answer", err)
	}
	insert(1_000_002) // while the replica cannot see the database

	p.SetTarget(target)
	t.Logf("SERVING %v after the database came back", w.await(healthpb.HealthCheckResponse_SERVING))
	if u, err := s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: 1_000_002}); err != nil || u.GetName() != "other" {
		t.Fatalf("GetUser of the row written while the replica was away, once SERVING: %v, %v", u, err)
	}
	q = s.a.db.Lookups.Load()
	_, err = s.users.GetUser(ctx, &usersv1.GetUserRequest{Id: 2_000_000})
	s.guardNotFound(t, "GetUser(unknown) once SERVING", q, err)
}
