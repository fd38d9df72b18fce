package integration

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cuckooguard/cuckooguard/examples/grpcapi/usersv1"
	"github.com/cuckooguard/cuckooguard/examples/internal/pgtest"
	"github.com/cuckooguard/cuckooguard/pgguard"
	"github.com/cuckooguard/cuckooguard/rpcguard"
)

// rpcReplica is one replica of a users service on pgguard: the users
// table guarded by rpcguard, served over gRPC and over Connect.
type rpcReplica struct {
	svc   *pgguard.Service
	users *pgguard.Table[int64, string]
	grpc  string // address
	conn  string // base URL
}

// usersRPC is the service's two methods, for either transport.
type usersRPC struct{ users *pgguard.Table[int64, string] }

func (u usersRPC) get(ctx context.Context, req *usersv1.GetUserRequest) (*usersv1.User, error) {
	name, err := u.users.Loader().Get(ctx, req.GetId())
	if pgguard.NotFound(err) {
		return nil, status.Error(codes.NotFound, "no such user")
	} else if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &usersv1.User{Id: req.GetId(), Name: name}, nil
}

func (u usersRPC) create(ctx context.Context, req *usersv1.CreateUserRequest) (*usersv1.User, error) {
	var id int64
	_, err := u.users.InsertGenerated(ctx, func(ctx context.Context, tx pgx.Tx, add func(int64) error) error {
		if err := tx.QueryRow(ctx, `INSERT INTO users (name) VALUES ($1) RETURNING id`, req.GetName()).Scan(&id); err != nil {
			return err
		}
		return add(id)
	})
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &usersv1.User{Id: id, Name: req.GetName()}, nil
}

type grpcUsers struct {
	usersv1.UnimplementedUserServiceServer
	usersRPC
}

func (g grpcUsers) GetUser(ctx context.Context, req *usersv1.GetUserRequest) (*usersv1.User, error) {
	return g.get(ctx, req)
}

func (g grpcUsers) CreateUser(ctx context.Context, req *usersv1.CreateUserRequest) (*usersv1.User, error) {
	return g.create(ctx, req)
}

func startRPCReplica(t *testing.T, pool *pgxpool.Pool, nc *nats.Conn, service, origin string) *rpcReplica {
	t.Helper()
	r := &rpcReplica{users: &pgguard.Table[int64, string]{Name: "users", Column: "id", Get: func(ctx context.Context, id int64) (string, error) {
		var name string
		return name, pool.QueryRow(ctx, `SELECT name FROM users WHERE id = $1`, id).Scan(&name)
	}}}
	svc, err := pgguard.Start(context.Background(), pgguard.Config{Pool: pool, NATS: nc, Service: service, Origin: origin, Logger: discard}, r.users)
	if err != nil {
		t.Fatal(err)
	}
	r.svc = svc
	t.Cleanup(func() { svc.Close() })
	ic, err := rpcguard.New(r.users.Loader(), rpcguard.Keys[int64]{usersv1.UserService_GetUser_FullMethodName: rpcguard.Field[int64]("id")})
	if err != nil {
		t.Fatal(err)
	}
	impl := usersRPC{r.users}
	// gRPC.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()))
	usersv1.RegisterUserServiceServer(gs, grpcUsers{usersRPC: impl})
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	r.grpc = ln.Addr().String()
	// Connect, without generated handlers.
	mux := http.NewServeMux()
	mux.Handle(usersv1.UserService_GetUser_FullMethodName, connect.NewUnaryHandler(usersv1.UserService_GetUser_FullMethodName,
		func(ctx context.Context, req *connect.Request[usersv1.GetUserRequest]) (*connect.Response[usersv1.User], error) {
			u, err := impl.get(ctx, req.Msg)
			return connectResp(u, err)
		}, connect.WithInterceptors(ic)))
	mux.Handle(usersv1.UserService_CreateUser_FullMethodName, connect.NewUnaryHandler(usersv1.UserService_CreateUser_FullMethodName,
		func(ctx context.Context, req *connect.Request[usersv1.CreateUserRequest]) (*connect.Response[usersv1.User], error) {
			u, err := impl.create(ctx, req.Msg)
			return connectResp(u, err)
		}, connect.WithInterceptors(ic)))
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln2)
	t.Cleanup(func() { hs.Close() })
	r.conn = "http://" + ln2.Addr().String()
	return r
}

// discard is the replicas' logger: the test reports what it measures.
var discard = slog.New(slog.DiscardHandler)

func connectResp(u *usersv1.User, err error) (*connect.Response[usersv1.User], error) {
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return nil, connect.NewError(connect.CodeNotFound, errors.New("no such user"))
		}
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(u), nil
}

// TestReadYourWritesOverRPC: clients create users through replica A, over
// gRPC and over Connect, and at once, with no sleep, read each through B
// and C with the token A's response carried (rpcguard.TokenMetadata): 0
// NotFound, through the relay (or direct, without a NATS server), over
// gRPC while the relay's holder stops and another replica takes over.
// B's guard alone would have said NotFound for most of them.
func TestReadYourWritesOverRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("a long integration test")
	}
	dsn := pgtest.Schema(t, pgtest.DSN(t))
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE users (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var nc *nats.Conn
	mode := "direct"
	if url := os.Getenv("CUCKOOGUARD_NATS_URL"); url != "" {
		if nc, err = nats.Connect(url, nats.MaxReconnects(-1)); err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		mode = "relay"
	}
	service := "rpc_" + strings.ReplaceAll(strings.TrimPrefix(dsn[strings.Index(dsn, "search_path=")+len("search_path="):], "t_"), "%", "_")
	if nc != nil {
		defer pgguard.Teardown(context.WithoutCancel(ctx), pool, nc, service, "users")
	}
	// The relay's holder starts first, and stops during the gRPC run: a
	// takeover (through NATS).
	holder := startRPCReplica(t, pool, nc, service, "holder")
	var rs []*rpcReplica
	for _, o := range []string{"a", "b", "c"} {
		rs = append(rs, startRPCReplica(t, pool, nc, service, o))
	}
	for _, r := range append([]*rpcReplica{holder}, rs...) {
		for deadline := time.Now().Add(30 * time.Second); !r.svc.Ready(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("a replica never got ready")
			}
		}
	}
	const n = 2000
	for _, transport := range []string{"grpc", "connect"} {
		t.Run(transport, func(t *testing.T) {
			create, get := rpcClients(t, transport, rs)
			var wrong, without atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			var wg sync.WaitGroup
			var next atomic.Int64
			if transport == "grpc" && nc != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Load() < n/3 {
						time.Sleep(time.Millisecond)
					}
					t.Log("the relay's holder stops: another replica takes over")
					holder.svc.Close()
				}()
			}
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= n {
						id, token, err := create()
						if err != nil || token == "" {
							t.Errorf("create: %v, token %q", err, token)
							return
						}
						if rs[1].users.Loader().Ready() && !rs[1].users.Loader().MayContain(id) {
							without.Add(1)
						}
						for _, r := range []int{1, 2} {
							start := time.Now()
							err := get(r, id, token)
							d := time.Since(start)
							if err != nil && wrong.Add(1) <= 5 {
								t.Errorf("user %d created on A, read on replica %d with its token: %v", id, r, err)
							}
							mu.Lock()
							lat = append(lat, d)
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			slices.Sort(lat)
			t.Logf("%s, %s: %d users created on A and read at once on B and C with their token: %d not found; B's guard alone would have said NotFound for %d; GetUser with a token p50 %v p99 %v",
				mode, transport, n, wrong.Load(), without.Load(), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond))
		})
	}
}

// rpcClients returns create (through replica A) and get (through replica
// r, with a token) over transport.
func rpcClients(t *testing.T, transport string, rs []*rpcReplica) (create func() (int64, string, error), get func(r int, id int64, token string) error) {
	ctx := context.Background()
	if transport == "grpc" {
		var cs []usersv1.UserServiceClient
		for _, r := range rs {
			cc, err := grpc.NewClient(r.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			cs = append(cs, usersv1.NewUserServiceClient(cc))
		}
		create = func() (int64, string, error) {
			var md metadata.MD
			u, err := cs[0].CreateUser(ctx, &usersv1.CreateUserRequest{Name: "token"}, grpc.Header(&md))
			if err != nil {
				return 0, "", err
			}
			tok := md.Get(rpcguard.TokenMetadata)
			if len(tok) == 0 {
				return u.GetId(), "", nil
			}
			return u.GetId(), tok[0], nil
		}
		get = func(r int, id int64, token string) error {
			_, err := cs[r].GetUser(metadata.AppendToOutgoingContext(ctx, rpcguard.TokenMetadata, token), &usersv1.GetUserRequest{Id: id})
			return err
		}
		return create, get
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(hc.CloseIdleConnections)
	creator := connect.NewClient[usersv1.CreateUserRequest, usersv1.User](hc, rs[0].conn+usersv1.UserService_CreateUser_FullMethodName)
	var getters []*connect.Client[usersv1.GetUserRequest, usersv1.User]
	for _, r := range rs {
		getters = append(getters, connect.NewClient[usersv1.GetUserRequest, usersv1.User](hc, r.conn+usersv1.UserService_GetUser_FullMethodName))
	}
	create = func() (int64, string, error) {
		resp, err := creator.CallUnary(ctx, connect.NewRequest(&usersv1.CreateUserRequest{Name: "token"}))
		if err != nil {
			return 0, "", err
		}
		return resp.Msg.GetId(), resp.Header().Get(rpcguard.TokenMetadata), nil
	}
	get = func(r int, id int64, token string) error {
		req := connect.NewRequest(&usersv1.GetUserRequest{Id: id})
		req.Header().Set(rpcguard.TokenMetadata, token)
		_, err := getters[r].CallUnary(ctx, req)
		return err
	}
	return create, get
}
