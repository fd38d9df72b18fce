package rpcguard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"github.com/puzpuzpuz/xsync/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/cuckooguard/cuckooguard/internal/options"
	"github.com/cuckooguard/cuckooguard/middleware"
)

// Filter reports whether a key may exist: false only when the key is
// definitely absent. A *guarded.Loader implements it, and answers true
// while it is not ready; [middleware.GuardFilter] adapts a bare
// [guard.Guard]. It is the filter of package middleware: the interceptors
// call MayContain from every request's goroutine at once, before the
// handler, so it must be safe for concurrent use, and fast.
type Filter[K comparable] = middleware.Filter[K]

// Keys maps the full name of each method to guard, "/package.Service/Method"
// (the FullMethod of grpc.UnaryServerInfo, the Procedure of connect.Spec,
// and the …_FullMethodName and …Procedure constants of the generated code),
// to how the key is taken from its request.
type Keys[K comparable] map[string]Key[K]

// Option configures an Interceptor made by [New].
type Option func(*config)

type config struct {
	message   string
	rejection *status.Status // WithRejection; nil: NotFound with message and the guard's ErrorInfo
}

// DefaultMessage is the message of a rejection's status unless
// [WithMessage] sets another.
const DefaultMessage = "not found"

// WithMessage sets the message of the NotFound status that answers a
// request for an absent key, such as the one the handler gives for a
// missing row ("user not found"). The default is [DefaultMessage].
func WithMessage(msg string) Option {
	return func(c *config) { c.message = msg }
}

// WithRejection makes the answer to a request for an absent key st
// itself, detail for detail: give it the status the handler returns for a
// row it does not find, or will not show, and a client cannot tell the
// guard's answer from the handler's by its content. Without it a
// rejection carries a google.rpc.ErrorInfo (reason [ErrorReason]) that
// [FromGuard] reads: convenient in logs and tests, but it tells a client
// that the guard answered, so a handler that answers NotFound to hide
// another tenant's row would be told apart from a row that does not exist
// (see the package doc's "What a rejection reveals"). Over Connect the
// rejection has st's code, message and details. WithRejection replaces
// [WithMessage]; an OK status is an error from [New].
func WithRejection(st *status.Status) Option {
	return func(c *config) { c.rejection = st }
}

// Interceptor answers NotFound, without calling the handler, for requests
// of guarded methods whose key a [Filter] knows is absent. Its methods
// return the interceptors of gRPC ([Interceptor.Unary],
// [Interceptor.Stream]), and it is itself a [connect.Interceptor].
//
// An Interceptor is safe for concurrent use by multiple goroutines. Use
// [New] to make one.
type Interceptor[K comparable] struct {
	filter     Filter[K]
	methods    map[string]*method[K] // by full name; read-only after New
	unfiltered *xsync.Counter

	tokens, tokenRefused, tokensSet *xsync.Counter // consistency tokens (token.go)

	grpcErr      error                  // the gRPC rejection: immutable, so one value serves every request
	connectCode  connect.Code           // the Connect rejection's code,
	message      error                  // message
	errorDetails []*connect.ErrorDetail // and details
}

// method is a guarded method: how its key is taken, and its counters.
type method[K comparable] struct {
	key extractor[K]
	in  protoreflect.MessageType // its request type: a stream's first message is read into a new one

	rejected, passed, missingKey, falsePos *xsync.Counter
}

// An Interceptor is a Connect interceptor.
var _ connect.Interceptor = (*Interceptor[int64])(nil)

// New returns an Interceptor that asks f about the keys of the methods in
// keys. It resolves each method through the protobuf registry of the
// generated code (protoregistry.GlobalFiles: import the package generated
// for the service) and checks each Key against the method's request type;
// a method it cannot find, or a Key that does not fit the request, is an
// error. Methods not in keys pass unchanged.
func New[K comparable](f Filter[K], keys Keys[K], opts ...Option) (*Interceptor[K], error) {
	if isNil(f) {
		return nil, errors.New("rpcguard: New needs a filter")
	}
	if len(keys) == 0 {
		return nil, errors.New("rpcguard: New needs at least one method to guard")
	}
	c := config{message: DefaultMessage}
	if err := options.Apply("rpcguard: New", &c, opts); err != nil {
		return nil, err
	}
	ic := &Interceptor[K]{filter: f, methods: make(map[string]*method[K], len(keys)), unfiltered: xsync.NewCounter(),
		tokens: xsync.NewCounter(), tokenRefused: xsync.NewCounter(), tokensSet: xsync.NewCounter()}
	for _, name := range slices.Sorted(maps.Keys(keys)) { // the first error is the same every time
		m, err := newMethod(name, keys[name])
		if err != nil {
			return nil, err
		}
		ic.methods[name] = m
	}
	if err := ic.setRejection(c); err != nil {
		return nil, err
	}
	return ic, nil
}

// newMethod resolves the method named name and binds key to its request
// type.
func newMethod[K comparable](name string, key Key[K]) (*method[K], error) {
	md, err := findMethod(name)
	if err != nil {
		return nil, err
	}
	if key.bind == nil {
		return nil, fmt.Errorf("rpcguard: method %q: an empty Key: make one with Field or Func", name)
	}
	in := md.Input()
	x, err := key.bind(in)
	if err != nil {
		return nil, fmt.Errorf("rpcguard: method %q: key %s: %w", name, key.desc, err)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(in.FullName())
	if err != nil {
		return nil, fmt.Errorf("rpcguard: method %q: its request type %s: %w", name, in.FullName(), err)
	}
	return &method[K]{
		key: x, in: mt,
		rejected: xsync.NewCounter(), passed: xsync.NewCounter(), missingKey: xsync.NewCounter(), falsePos: xsync.NewCounter(),
	}, nil
}

// findMethod returns the descriptor of the method with the full name
// "/package.Service/Method".
func findMethod(name string) (protoreflect.MethodDescriptor, error) {
	svc, m, ok := strings.Cut(strings.TrimPrefix(name, "/"), "/")
	if !strings.HasPrefix(name, "/") || !ok || svc == "" || m == "" || strings.Contains(m, "/") {
		return nil, fmt.Errorf("rpcguard: method %q: not a full method name such as \"/package.Service/Method\"", name)
	}
	full := protoreflect.FullName(svc + "." + m)
	if !full.IsValid() {
		return nil, fmt.Errorf("rpcguard: method %q: not a valid protobuf name", name)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(full)
	if err != nil {
		return nil, fmt.Errorf("rpcguard: method %q: %w (import the package generated for its service)", name, err)
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return nil, fmt.Errorf("rpcguard: method %q: %s is not a method", name, full)
	}
	return md, nil
}

// screen counts a request of m (nil: a method not guarded) with message
// req, and reports whether to reject it; check tells whether to look at
// the handler's answer for an observed false positive.
func (ic *Interceptor[K]) screen(ctx context.Context, m *method[K], req any) (reject, check bool) {
	if m == nil {
		ic.unfiltered.Inc()
		return false, false
	}
	k, ok := m.key(req)
	if !ok {
		m.missingKey.Inc()
		return false, false
	}
	if !ic.mayContain(ctx, k) {
		m.rejected.Inc()
		return true, false
	}
	m.passed.Inc()
	return false, true
}

// Unary returns the gRPC unary server interceptor, for
// [grpc.ChainUnaryInterceptor] or [grpc.UnaryInterceptor]. A request of a
// guarded method whose key is absent gets the NotFound status, and the
// handler is not called; every other request reaches the handler
// unchanged. A NotFound from the handler for a request that passed counts
// as an observed false positive.
func (ic *Interceptor[K]) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m := ic.methods[info.FullMethod]
		if m == nil {
			ic.unfiltered.Inc()
			return ic.grpcWrite(ctx, req, handler)
		}
		ctx = ic.grpcToken(ctx)
		reject, check := ic.screen(ctx, m, req)
		if reject {
			return nil, ic.grpcErr
		}
		resp, err := handler(ctx, req)
		if check && err != nil && status.Code(err) == codes.NotFound {
			m.falsePos.Inc()
		}
		return resp, err
	}
}

// Stream returns the gRPC stream server interceptor, for
// [grpc.ChainStreamInterceptor] or [grpc.StreamInterceptor]. For a guarded
// streaming method the key is in the client's first message: the
// interceptor reads it before it calls the handler (whose first RecvMsg
// then gets a copy of it), and answers NotFound without calling the
// handler if its key is absent. Guard only methods whose client speaks
// first: a bidirectional method whose server sends before it receives
// would wait for the client here. A stream whose first message does not
// arrive (the client sent none, or the stream broke) reaches the handler,
// whose first RecvMsg gets the same error.
func (ic *Interceptor[K]) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		m := ic.methods[info.FullMethod]
		if m == nil {
			ic.unfiltered.Inc()
			return ic.grpcStreamWrite(srv, ss, handler)
		}
		ctx := ic.grpcToken(ss.Context())
		return ic.screenFirst(ctx, m, ss.RecvMsg, func() error { return ic.grpcErr },
			func(r replay) error {
				r.internal = grpcInternal
				return handler(srv, &replayStream{ServerStream: ss, replay: r, ctx: ctx})
			},
			func(err error) bool { return status.Code(err) == codes.NotFound })
	}
}

// screenFirst screens a stream of method m by its first message, received
// with recv: if the key is absent it returns rejected() and does not call
// handler; otherwise it calls handler with the replay of what it received
// (the message, or recv's error), and counts an error of the handler that
// notFound recognizes as a false positive.
func (ic *Interceptor[K]) screenFirst(ctx context.Context, m *method[K], recv func(any) error, rejected func() error, handler func(replay) error, notFound func(error) bool) error {
	first := m.in.New().Interface()
	if err := recv(first); err != nil {
		m.missingKey.Inc()
		return handler(replay{err: err})
	}
	reject, check := ic.screen(ctx, m, first)
	if reject {
		return rejected()
	}
	err := handler(replay{first: first})
	if check && err != nil && notFound(err) {
		m.falsePos.Inc()
	}
	return err
}

// replay gives a stream handler's first receive the message, or the
// error, that the interceptor received.
type replay struct {
	first    proto.Message
	err      error
	replayed bool
	internal func(error) error // the transport's Internal error of a message the handler cannot receive into
}

// take answers the first receive into m, and reports whether it did:
// after that, the stream's own receive answers.
func (r *replay) take(m any) (bool, error) {
	if r.replayed {
		return false, nil
	}
	r.replayed = true
	if r.err != nil {
		return true, r.err
	}
	if err := copyInto(m, r.first); err != nil {
		return true, r.internal(err)
	}
	return true, nil
}

func grpcInternal(err error) error { return status.Error(codes.Internal, err.Error()) }

func connectInternal(err error) error { return connect.NewError(connect.CodeInternal, err) }

// replayStream is a gRPC stream whose first RecvMsg is a replay.
type replayStream struct {
	grpc.ServerStream
	replay
	ctx context.Context // the stream's, under the request's token
}

func (s *replayStream) Context() context.Context { return s.ctx }

func (s *replayStream) RecvMsg(m any) error {
	if ok, err := s.take(m); ok {
		return err
	}
	return s.ServerStream.RecvMsg(m)
}

// copyInto makes dst, the message a handler receives into, a copy of src.
func copyInto(dst any, src proto.Message) error {
	d, ok := dst.(proto.Message)
	if !ok || d.ProtoReflect().Descriptor().FullName() != src.ProtoReflect().Descriptor().FullName() {
		return fmt.Errorf("rpcguard: the handler receives into a %T, the method's request is %s", dst, src.ProtoReflect().Descriptor().FullName())
	}
	proto.Reset(d)
	proto.Merge(d, src)
	return nil
}

// WrapUnary implements [connect.Interceptor]: a request of a guarded
// procedure whose key is absent gets a [connect.CodeNotFound] error, and
// the handler is not called. On a client it does nothing.
func (ic *Interceptor[K]) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		if spec.IsClient {
			return next(ctx, req)
		}
		m := ic.methods[spec.Procedure]
		if m == nil {
			ic.unfiltered.Inc()
			return ic.connectWrite(ctx, req, next)
		}
		ctx = ic.withToken(ctx, req.Header().Get(middleware.TokenHeader))
		reject, check := ic.screen(ctx, m, req.Any())
		if reject {
			return nil, ic.connectErr()
		}
		resp, err := next(ctx, req)
		if check && err != nil && connect.CodeOf(err) == connect.CodeNotFound {
			m.falsePos.Inc()
		}
		return resp, err
	}
}

// WrapStreamingClient implements [connect.Interceptor]: it returns next.
func (ic *Interceptor[K]) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements [connect.Interceptor] for streaming
// procedures, as [Interceptor.Stream] does for gRPC: it reads the client's
// first message before it calls the handler, and answers
// [connect.CodeNotFound] without calling it if the message's key is
// absent.
func (ic *Interceptor[K]) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		m := ic.methods[conn.Spec().Procedure]
		if m == nil {
			ic.unfiltered.Inc()
			return ic.connectStreamWrite(ctx, conn, next)
		}
		ctx = ic.withToken(ctx, conn.RequestHeader().Get(middleware.TokenHeader))
		return ic.screenFirst(ctx, m, conn.Receive, ic.connectErr,
			func(r replay) error {
				r.internal = connectInternal
				return next(ctx, &replayConn{StreamingHandlerConn: conn, replay: r})
			},
			func(err error) bool { return connect.CodeOf(err) == connect.CodeNotFound })
	}
}

// replayConn is a Connect stream whose first Receive is a replay.
type replayConn struct {
	connect.StreamingHandlerConn
	replay
}

func (c *replayConn) Receive(m any) error {
	if ok, err := c.take(m); ok {
		return err
	}
	return c.StreamingHandlerConn.Receive(m)
}

// isNil reports whether v is nil or holds a nil pointer, func, map or
// channel: an argument that would panic at the first request rather than
// now.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
