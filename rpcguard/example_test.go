package rpcguard_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/rpcguard"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb"
	"github.com/cuckooguard/cuckooguard/rpcguard/internal/testpb/testpbconnect"
)

func ExampleNew() {
	// A Loader over the users table; here the table is a map.
	rows := map[int64]string{42: "Ada"}
	g, err := guard.New()
	if err != nil {
		panic(err)
	}
	users, err := guarded.New(g, guarded.GetterFunc[int64, string](func(_ context.Context, id int64) (string, error) {
		if name, ok := rows[id]; ok {
			return name, nil
		}
		return "", guarded.ErrNotFound
	}))
	if err != nil {
		panic(err)
	}
	defer users.Close()
	if err := users.Fill(context.Background(), guarded.KeysOf(func(yield func(int64) bool) {
		for id := range rows {
			if !yield(id) {
				return
			}
		}
	})); err != nil {
		panic(err)
	}

	// GetUser's key is its request's field id.
	ic, err := rpcguard.New(users, rpcguard.Keys[int64]{
		testpb.Users_GetUser_FullMethodName: rpcguard.Field[int64]("id"),
	})
	if err != nil {
		panic(err)
	}

	// What a gRPC server does with the interceptor, without the network.
	unary := ic.Unary()
	info := &grpc.UnaryServerInfo{FullMethod: testpb.Users_GetUser_FullMethodName}
	handler := func(ctx context.Context, req any) (any, error) {
		fmt.Println("handler called for", req.(*testpb.GetUserRequest).GetId())
		return &testpb.User{}, nil
	}
	for _, id := range []int64{42, 7} {
		_, err := unary(context.Background(), &testpb.GetUserRequest{Id: id}, info, handler)
		fmt.Printf("id %d: %v, from the guard: %v\n", id, status.Code(err), rpcguard.FromGuard(err))
	}
	st := ic.Stats().Methods[testpb.Users_GetUser_FullMethodName]
	fmt.Printf("rejected %d, passed %d\n", st.Rejected, st.Passed)
	// Output:
	// handler called for 42
	// id 42: OK, from the guard: false
	// id 7: NotFound, from the guard: true
	// rejected 1, passed 1
}

// A gRPC server whose GetUser is guarded, with a health service whose
// status follows the Loader's readiness.
func Example_grpc() {
	var users *guarded.Loader[int64, string] // filled elsewhere
	ic, err := rpcguard.New(users, rpcguard.Keys[int64]{
		testpb.Users_GetUser_FullMethodName:   rpcguard.Field[int64]("id"),
		testpb.Users_WatchUser_FullMethodName: rpcguard.Field[int64]("id"),
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
	testpb.RegisterUsersServer(srv, testpb.UnimplementedUsersServer{}) // your implementation
	hs := health.NewServer()
	// NOT_SERVING until the Loader is ready, from before the server
	// serves.
	h, err := rpcguard.NewHealth(users, hs, rpcguard.WithServices("", testpbconnect.UsersName))
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go h.Run(ctx)
	healthpb.RegisterHealthServer(srv, h.Server(hs)) // Check asks users at the call

	ln, err := net.Listen("tcp", "127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(ln))
}

// A Connect server whose GetUser is guarded, with a health service whose
// status follows the Loader's readiness.
func Example_connect() {
	var users *guarded.Loader[int64, string] // filled elsewhere
	ic, err := rpcguard.New(users, rpcguard.Keys[int64]{
		testpbconnect.UsersGetUserProcedure: rpcguard.Field[int64]("id"),
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(testpbconnect.NewUsersHandler(testpbconnect.UnimplementedUsersHandler{}, connect.WithInterceptors(ic))) // your implementation
	checker := grpchealth.NewStaticChecker()
	h, err := rpcguard.NewHealth(users, rpcguard.StatusSetterFunc(func(svc string, st healthpb.HealthCheckResponse_ServingStatus) {
		checker.SetStatus(svc, grpchealth.Status(st))
	}), rpcguard.WithServices("", testpbconnect.UsersName))
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go h.Run(ctx)
	mux.Handle(grpchealth.NewHandler(checker))

	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true) // gRPC clients and probes, without TLS
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux, Protocols: p}
	log.Fatal(srv.ListenAndServe())
}
