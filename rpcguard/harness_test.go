package rpcguard_test

import (
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb/testpbconnect"
)

// store is the users table of the tests: a map, and the number of times
// each handler ran.
type store struct {
	mu    sync.RWMutex // protects names
	names map[int64]string

	calls sync.Map // method name → *atomic.Int64: handler calls
}

func newStore(n int64) *store {
	s := &store{names: make(map[int64]string)}
	for id := int64(1); id <= n; id++ {
		s.names[id] = "user " + strconv.FormatInt(id, 10)
	}
	return s
}

func (s *store) lookup(_ context.Context, id int64) (string, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if name, ok := s.names[id]; ok {
		return name, nil
	}
	return "", guarded.ErrNotFound
}

func (s *store) byName(name string) (int64, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for id, n := range s.names {
		if n == name {
			return id, true
		}
	}
	return 0, false
}

// called counts a call of the handler of method.
func (s *store) called(method string) {
	c, ok := s.calls.Load(method)
	if !ok {
		c, _ = s.calls.LoadOrStore(method, new(atomic.Int64))
	}
	c.(*atomic.Int64).Add(1)
}

// callsOf returns how often the handler of method ran.
func (s *store) callsOf(method string) int64 {
	c, ok := s.calls.Load(method)
	if !ok {
		return 0
	}
	return c.(*atomic.Int64).Load()
}

// newLoader returns a Loader over s, filled if filled.
func newLoader(t testing.TB, s *store, filled bool) *guarded.Loader[int64, string] {
	t.Helper()
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, string](s.lookup))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if filled {
		fill(t, l, s)
	}
	return l
}

// fedLoader returns a Loader of K over get with a change feed attached,
// as a follower keeps one: both end with the test.
func fedLoader[K comparable](t testing.TB, get func(context.Context, K) (string, error)) (*guarded.Loader[K, string], *guarded.Feed[K]) {
	t.Helper()
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[K, string](get))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(feed.Detach)
	return l, feed
}

// fill fills l with the ids of s.
func fill(t testing.TB, l *guarded.Loader[int64, string], s *store) {
	t.Helper()
	s.mu.RLock()
	ids := slices.Collect(maps.Keys(s.names))
	s.mu.RUnlock()
	if err := l.Fill(context.Background(), guarded.KeysOf(slices.Values(ids))); err != nil {
		t.Fatal(err)
	}
}

// service implements the Users service over a Loader, for gRPC and for
// Connect. A handler panics for the id panicID, which only
// TestChainWithGoGRPCMiddleware puts in its store.
type service struct {
	testpb.UnimplementedUsersServer
	s      *store
	loader *guarded.Loader[int64, string]
}

const panicID = -666

// get is what every handler does: the Loader's Get.
func (sv *service) get(ctx context.Context, method string, id int64) (*testpb.User, error) {
	sv.s.called(method)
	if id == panicID {
		panic("the handler panics for panicID")
	}
	name, err := sv.loader.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return &testpb.User{Id: id, Name: name}, nil
}

// grpcErr turns a Loader error into a gRPC status.
func grpcErr(err error) error {
	if errors.Is(err, guarded.ErrNotFound) {
		return status.Error(codes.NotFound, "user not found")
	}
	return err
}

// connectErr turns a Loader error into a Connect error.
func connectErr(err error) error {
	if errors.Is(err, guarded.ErrNotFound) {
		return connect.NewError(connect.CodeNotFound, errors.New("user not found"))
	}
	return err
}

func (sv *service) GetUser(ctx context.Context, req *testpb.GetUserRequest) (*testpb.User, error) {
	u, err := sv.get(ctx, "GetUser", req.GetId())
	return u, grpcErr(err)
}

func (sv *service) GetByName(ctx context.Context, req *testpb.GetByNameRequest) (*testpb.User, error) {
	sv.s.called("GetByName")
	id, ok := sv.s.byName(req.GetName())
	if !ok {
		return nil, status.Error(codes.NotFound, "user not found")
	}
	return &testpb.User{Id: id, Name: req.GetName()}, nil
}

func (sv *service) WatchUser(req *testpb.GetUserRequest, stream grpc.ServerStreamingServer[testpb.User]) error {
	u, err := sv.get(stream.Context(), "WatchUser", req.GetId())
	if err != nil {
		return grpcErr(err)
	}
	return stream.Send(u)
}

func (sv *service) Rename(stream grpc.ClientStreamingServer[testpb.RenameRequest, testpb.User]) error {
	var u *testpb.User
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if u == nil {
			if u, err = sv.get(stream.Context(), "Rename", req.GetId()); err != nil {
				return grpcErr(err)
			}
		}
		u.Name = req.GetName()
	}
	if u == nil {
		sv.s.called("Rename")
		return status.Error(codes.InvalidArgument, "no message")
	}
	return stream.SendAndClose(u)
}

func (sv *service) Ping(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	sv.s.called("Ping")
	return &testpb.Empty{}, nil
}

// connectService is service for Connect.
type connectService struct{ *service }

func (c connectService) GetUser(ctx context.Context, req *connect.Request[testpb.GetUserRequest]) (*connect.Response[testpb.User], error) {
	u, err := c.get(ctx, "GetUser", req.Msg.GetId())
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(u), nil
}

func (c connectService) GetByName(ctx context.Context, req *connect.Request[testpb.GetByNameRequest]) (*connect.Response[testpb.User], error) {
	c.s.called("GetByName")
	id, ok := c.s.byName(req.Msg.GetName())
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("user not found"))
	}
	return connect.NewResponse(&testpb.User{Id: id, Name: req.Msg.GetName()}), nil
}

func (c connectService) WatchUser(ctx context.Context, req *connect.Request[testpb.GetUserRequest], stream *connect.ServerStream[testpb.User]) error {
	u, err := c.get(ctx, "WatchUser", req.Msg.GetId())
	if err != nil {
		return connectErr(err)
	}
	return stream.Send(u)
}

func (c connectService) Rename(ctx context.Context, stream *connect.ClientStream[testpb.RenameRequest]) (*connect.Response[testpb.User], error) {
	var u *testpb.User
	for stream.Receive() {
		if u == nil {
			var err error
			if u, err = c.get(ctx, "Rename", stream.Msg().GetId()); err != nil {
				return nil, connectErr(err)
			}
		}
		u.Name = stream.Msg().GetName()
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	if u == nil {
		c.s.called("Rename")
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no message"))
	}
	return connect.NewResponse(u), nil
}

func (c connectService) Ping(context.Context, *connect.Request[testpb.Empty]) (*connect.Response[testpb.Empty], error) {
	c.s.called("Ping")
	return connect.NewResponse(&testpb.Empty{}), nil
}

func (c connectService) Kinds(context.Context, *connect.Request[testpb.AllKinds]) (*connect.Response[testpb.Empty], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, nil)
}

// client is what the tests call, through either server.
type client interface {
	GetUser(ctx context.Context, id int64) (*testpb.User, error)
	GetByName(ctx context.Context, name string) (*testpb.User, error)
	// WatchUser returns the users the stream sent before it ended.
	WatchUser(ctx context.Context, id int64) ([]*testpb.User, error)
	Rename(ctx context.Context, reqs ...*testpb.RenameRequest) (*testpb.User, error)
	Ping(ctx context.Context) error
}

// grpcClient calls a server through google.golang.org/grpc.
type grpcClient struct{ c testpb.UsersClient }

func (g grpcClient) GetUser(ctx context.Context, id int64) (*testpb.User, error) {
	return g.c.GetUser(ctx, &testpb.GetUserRequest{Id: id})
}

func (g grpcClient) GetByName(ctx context.Context, name string) (*testpb.User, error) {
	return g.c.GetByName(ctx, &testpb.GetByNameRequest{Name: name})
}

func (g grpcClient) WatchUser(ctx context.Context, id int64) ([]*testpb.User, error) {
	stream, err := g.c.WatchUser(ctx, &testpb.GetUserRequest{Id: id})
	if err != nil {
		return nil, err
	}
	var got []*testpb.User
	for {
		u, err := stream.Recv()
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, u)
	}
}

func (g grpcClient) Rename(ctx context.Context, reqs ...*testpb.RenameRequest) (*testpb.User, error) {
	stream, err := g.c.Rename(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if err := stream.Send(r); err != nil {
			break // the server answered: CloseAndRecv says what
		}
	}
	return stream.CloseAndRecv()
}

func (g grpcClient) Ping(ctx context.Context) error {
	_, err := g.c.Ping(ctx, &testpb.Empty{})
	return err
}

// connectClient calls a server through connectrpc.com/connect.
type connectClient struct{ c testpbconnect.UsersClient }

func (c connectClient) GetUser(ctx context.Context, id int64) (*testpb.User, error) {
	resp, err := c.c.GetUser(ctx, connect.NewRequest(&testpb.GetUserRequest{Id: id}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c connectClient) GetByName(ctx context.Context, name string) (*testpb.User, error) {
	resp, err := c.c.GetByName(ctx, connect.NewRequest(&testpb.GetByNameRequest{Name: name}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c connectClient) WatchUser(ctx context.Context, id int64) ([]*testpb.User, error) {
	stream, err := c.c.WatchUser(ctx, connect.NewRequest(&testpb.GetUserRequest{Id: id}))
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var got []*testpb.User
	for stream.Receive() {
		got = append(got, stream.Msg())
	}
	return got, stream.Err()
}

func (c connectClient) Rename(ctx context.Context, reqs ...*testpb.RenameRequest) (*testpb.User, error) {
	stream := c.c.Rename(ctx)
	for _, r := range reqs {
		if err := stream.Send(r); err != nil {
			break // the server answered: CloseAndReceive says what
		}
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c connectClient) Ping(ctx context.Context) error {
	_, err := c.c.Ping(ctx, connect.NewRequest(&testpb.Empty{}))
	return err
}

// transports are the ways the tests reach a server: a gRPC server through
// grpc-go, and a Connect server through the Connect protocol (HTTP/1.1)
// and through the gRPC protocol (HTTP/2 without TLS).
var transports = []string{"grpc", "connect", "connect-grpc"}

// server is a Users service over loopback TCP, with a health service.
type server struct {
	addr   string
	client client
	// health is a health client on a connection of its own.
	health healthpb.HealthClient
	// setter sets the statuses the health service answers.
	setter interface {
		SetServingStatus(string, healthpb.HealthCheckResponse_ServingStatus)
	}
}

// serverConfig is what a test puts in front of the service.
type serverConfig struct {
	unary   []grpc.UnaryServerInterceptor
	stream  []grpc.StreamServerInterceptor
	connect []connect.Interceptor
}

// startServer serves sv over transport on a loopback TCP port until the
// end of the test.
func startServer(t testing.TB, transport string, sv *service, cfg serverConfig) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &server{addr: ln.Addr().String()}
	switch transport {
	case "grpc":
		gs := grpc.NewServer(grpc.ChainUnaryInterceptor(cfg.unary...), grpc.ChainStreamInterceptor(cfg.stream...))
		testpb.RegisterUsersServer(gs, sv)
		hs := health.NewServer()
		healthpb.RegisterHealthServer(gs, hs)
		srv.setter = hs
		done := make(chan error, 1)
		go func() { done <- gs.Serve(ln) }()
		t.Cleanup(func() {
			gs.Stop()
			if err := <-done; err != nil {
				t.Errorf("grpc Serve: %v", err)
			}
		})
		srv.client = grpcClient{testpb.NewUsersClient(dial(t, srv.addr))}
	case "connect", "connect-grpc":
		mux := http.NewServeMux()
		mux.Handle(testpbconnect.NewUsersHandler(connectService{sv}, connect.WithInterceptors(cfg.connect...)))
		checker := grpchealth.NewStaticChecker()
		mux.Handle(grpchealth.NewHandler(checker))
		srv.setter = statusSetter(func(svc string, st healthpb.HealthCheckResponse_ServingStatus) {
			checker.SetStatus(svc, grpchealth.Status(st))
		})
		p := new(http.Protocols)
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		hs := &http.Server{Handler: mux, Protocols: p, ReadHeaderTimeout: 10 * time.Second}
		done := make(chan error, 1)
		go func() { done <- hs.Serve(ln) }()
		t.Cleanup(func() {
			hs.Close()
			if err := <-done; !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("http Serve: %v", err)
			}
		})
		cp := new(http.Protocols)
		var opts []connect.ClientOption
		if transport == "connect" {
			cp.SetHTTP1(true)
		} else {
			cp.SetUnencryptedHTTP2(true)
			opts = append(opts, connect.WithGRPC())
		}
		tr := &http.Transport{Protocols: cp}
		t.Cleanup(tr.CloseIdleConnections)
		srv.client = connectClient{testpbconnect.NewUsersClient(&http.Client{Transport: tr}, "http://"+srv.addr, opts...)}
	default:
		t.Fatalf("unknown transport %q", transport)
	}
	// The health client is another client, on a connection of its own:
	// grpc-go speaks the gRPC protocol to either server (to the Connect
	// server over HTTP/2 without TLS), as a Kubernetes gRPC probe does.
	srv.health = healthpb.NewHealthClient(dial(t, srv.addr))
	return srv
}

type statusSetter func(string, healthpb.HealthCheckResponse_ServingStatus)

func (f statusSetter) SetServingStatus(svc string, st healthpb.HealthCheckResponse_ServingStatus) {
	f(svc, st)
}

// dial returns a grpc-go connection to addr, closed at the end of the
// test.
func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// code returns the status code of err, from either client.
func code(err error) codes.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return codes.Code(ce.Code())
	}
	return status.Code(err)
}

// testCtx returns a context that ends with the test, or after 30 s.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
