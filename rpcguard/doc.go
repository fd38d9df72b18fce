// Package rpcguard implements gRPC and Connect interceptors that answer
// NotFound for requests whose key a guard knows is absent, before the
// handler (and its database query) runs, and sets the grpc.health.v1
// status of a server from the guard's readiness. It is what package
// middleware is to net/http handlers, for google.golang.org/grpc and
// connectrpc.com/connect services, and a module of its own, so that users
// of the core build no gRPC code.
//
// An [Interceptor] guards the methods it is given, each with the way its
// key is taken from the request message: a field named by its protobuf
// name ([Field]) or a function of the caller's ([Func]), both checked
// against the method's request type when [New] makes the Interceptor. For
// a request of a guarded method it asks a [Filter] (a *guarded.Loader, or
// a guard through [middleware.GuardFilter]) whether the key may exist; if
// not, it answers codes.NotFound (gRPC) or connect.CodeNotFound (Connect)
// without calling the handler, with a google.rpc.ErrorInfo detail
// ([ErrorReason], [ErrorDomain]) that says the guard answered
// ([FromGuard] reads it). Every other request reaches the handler
// unchanged: requests of methods not guarded, requests without a
// well-formed key, and every request while the Loader is not ready (it
// answers "may exist" until it is). The interceptors never modify a
// request, and look nothing up in the store.
//
// The guarantee is the guard's: a key that exists is never answered
// NotFound. About 0.01% of absent keys still reach the handler; a handler
// that answers NotFound for a request that passed counts as an observed
// false positive ([Interceptor.Stats]; package metrics/rpcmetrics exports
// the counters to Prometheus, labelled by method).
//
// The interceptors are plain gRPC and Connect interceptors: chain them
// with grpc.ChainUnaryInterceptor and grpc.ChainStreamInterceptor, beside
// go-grpc-middleware's logging and recovery, or pass the Interceptor to
// connect.WithInterceptors. Put them after recovery (inside it) if a
// Filter of your own may panic, and after authentication: a NotFound
// answered before authentication tells an unauthenticated client which
// keys do not exist.
//
// For streaming methods the key is in the client's first message, which
// the interceptor reads before it calls the handler ([Interceptor.Stream]).
//
// A [Health] sets the serving status of a health server from a
// [Readier], the readiness that /readyz reports over HTTP: SERVING while
// the guard answers on its own (filled, and its follower following),
// NOT_SERVING while it passes lookups through, so that a Kubernetes gRPC
// probe takes a replica whose lookups would all reach the store out of
// rotation.
//
// Usage:
//
//	users, err := guarded.New(g, guarded.GetterFunc[int64, User](db.LookupUser))
//	if err != nil {
//		return err
//	}
//	ic, err := rpcguard.New(users, rpcguard.Keys[int64]{
//		usersv1.UserService_GetUser_FullMethodName: rpcguard.Field[int64]("id"),
//	})
//	if err != nil {
//		return err
//	}
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
//	hs := health.NewServer()
//	h, err := rpcguard.NewHealth(users, hs) // NOT_SERVING until users is ready
//	if err != nil {
//		return err
//	}
//	go h.Run(ctx)
//	healthpb.RegisterHealthServer(srv, h.Server(hs)) // Check asks users at the call
//
// and for Connect:
//
//	path, handler := usersv1connect.NewUserServiceHandler(svc, connect.WithInterceptors(ic))
//
// # Reading your own writes
//
// A call of a method the interceptor does not guard (a write) runs under a
// context that collects the consistency tokens its handler's writes
// record (guarded.Wrote; pgguard's Table.Insert, InsertGenerated and
// Delete record theirs): the token goes back in the [TokenMetadata]
// header metadata (Connect: the Cuckooguard-Token header) of a unary
// response, and of a stream's first message, or in the trailer of a
// stream that sent none after the write. A call of a guarded method that
// carries a token is answered NotFound by the guard only once the
// replica's stream has reached it (waiting up to the Loader's token
// wait), and the handler's own lookups see the token too, so that a
// client that sends back the token of its last write reads that write on
// every replica. A token that does not read is counted
// (Stats.TokensRefused) and the call, and its handler's lookups, go to
// the store.
//
// # What a rejection reveals
//
// A rejection tells a client that no row has the key. Three things can
// tell it more than the handler would:
//
//   - Its content. By default a rejection carries a google.rpc.ErrorInfo
//     ([ErrorReason]) that [FromGuard] reads. A handler that answers
//     NotFound for a row the caller may not see (another tenant's) is then
//     told apart from a key that does not exist: the caller learns which
//     keys exist. [WithRejection] with the handler's own status makes the
//     two answers the same bytes.
//   - Its place in the chain. Chain the interceptor after authentication
//     and authorization: in front of them, an unauthenticated caller tells
//     NotFound (absent) from Unauthenticated (exists).
//   - Its speed. The guard answers in microseconds, the handler after a
//     store round trip: a caller who times the answers can tell the two
//     apart whatever their content. Where that matters, key the guard by
//     what the caller may see (a multi-tenant table by tenant and id), so
//     that another tenant's row is absent to the guard too, or delay
//     rejections to the handler's usual time in an interceptor of your own.
package rpcguard
