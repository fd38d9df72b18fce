package rpcguard

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/middleware"
)

// TokenMetadata is the gRPC metadata key (and, lower-cased, the Connect
// header, middleware.TokenHeader) that carries a consistency token
// ([guarded.Token]): the interceptor sets it on the response of a unary
// write whose handler recorded one ([guarded.Wrote], which pgguard's
// Table writes call), and honours it on a request, for its own answer and
// the handler's lookups, so that a client that sends back the token of
// its last write reads that write on every replica.
const TokenMetadata = "cuckooguard-token"

// withToken returns ctx under the token of text: one that does not read
// passes every lookup through.
func (ic *Interceptor[K]) withToken(ctx context.Context, text string) context.Context {
	if text == "" {
		return ctx
	}
	ic.tokens.Inc()
	tok, err := guarded.ParseToken(text)
	if err != nil {
		ic.tokenRefused.Inc()
		return guarded.WithUnreadableToken(ctx)
	}
	return guarded.WithToken(ctx, tok)
}

// grpcToken returns ctx under the token of its incoming metadata.
func (ic *Interceptor[K]) grpcToken(ctx context.Context) context.Context {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(TokenMetadata); len(v) > 0 {
			return ic.withToken(ctx, v[0])
		}
	}
	return ctx
}

// mayContain asks the filter about k under ctx, which may carry a token.
func (ic *Interceptor[K]) mayContain(ctx context.Context, k K) bool {
	if cf, ok := ic.filter.(middleware.ContextFilter[K]); ok {
		return cf.MayContainContext(ctx, k)
	}
	if _, ok := guarded.TokenFrom(ctx); ok {
		return true // a bare filter cannot wait for a token
	}
	return ic.filter.MayContain(k)
}

// grpcWrite runs a unary handler of a method the interceptor does not
// guard (a write), and sets the token its writes recorded on the
// response's header metadata.
func (ic *Interceptor[K]) grpcWrite(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
	var sink guarded.TokenSink
	resp, err := handler(guarded.WithTokenSink(ctx, &sink), req)
	if t := sink.Token(); !t.IsZero() {
		if grpc.SetHeader(ctx, metadata.Pairs(TokenMetadata, t.String())) == nil {
			ic.tokensSet.Inc()
		}
	}
	return resp, err
}

// connectWrite is grpcWrite for Connect.
func (ic *Interceptor[K]) connectWrite(ctx context.Context, req connect.AnyRequest, next connect.UnaryFunc) (connect.AnyResponse, error) {
	var sink guarded.TokenSink
	resp, err := next(guarded.WithTokenSink(ctx, &sink), req)
	if t := sink.Token(); !t.IsZero() && resp != nil {
		resp.Header().Set(middleware.TokenHeader, t.String())
		ic.tokensSet.Inc()
	}
	return resp, err
}

// grpcStreamWrite runs a stream handler of a method the interceptor does
// not guard, and sends the token its writes recorded: in the header
// metadata with its first message, if the token is there by then, else in
// the trailer.
func (ic *Interceptor[K]) grpcStreamWrite(srv any, ss grpc.ServerStream, handler grpc.StreamHandler) error {
	ws := &tokenStream{ServerStream: ss, ic: ic}
	ws.ctx = guarded.WithTokenSink(ss.Context(), &ws.sink)
	err := handler(srv, ws)
	if t := ws.sink.Token(); !t.IsZero() && !ws.sent {
		ss.SetTrailer(metadata.Pairs(TokenMetadata, t.String()))
		ic.tokensSet.Inc()
	}
	return err
}

// tokenStream is a gRPC stream whose context collects the tokens of its
// handler's writes, and whose first message carries the token recorded
// before it in the header.
type tokenStream struct {
	grpc.ServerStream
	ic   interface{ countSet() }
	ctx  context.Context
	sink guarded.TokenSink
	sent bool // the token went in the header
}

func (s *tokenStream) Context() context.Context { return s.ctx }

func (s *tokenStream) SendMsg(m any) error {
	if !s.sent {
		if t := s.sink.Token(); !t.IsZero() && s.ServerStream.SetHeader(metadata.Pairs(TokenMetadata, t.String())) == nil {
			s.sent = true
			s.ic.countSet()
		}
	}
	return s.ServerStream.SendMsg(m)
}

// countSet counts a token set.
func (ic *Interceptor[K]) countSet() { ic.tokensSet.Inc() }

// connectStreamWrite is grpcStreamWrite for Connect: the token goes in the
// response header with the first message, else in the trailer.
func (ic *Interceptor[K]) connectStreamWrite(ctx context.Context, conn connect.StreamingHandlerConn, next connect.StreamingHandlerFunc) error {
	wc := &tokenConn{StreamingHandlerConn: conn, ic: ic}
	err := next(guarded.WithTokenSink(ctx, &wc.sink), wc)
	if t := wc.sink.Token(); !t.IsZero() && !wc.sent {
		conn.ResponseTrailer().Set(middleware.TokenHeader, t.String())
		ic.tokensSet.Inc()
	}
	return err
}

// tokenConn is tokenStream for Connect.
type tokenConn struct {
	connect.StreamingHandlerConn
	ic   interface{ countSet() }
	sink guarded.TokenSink
	sent bool
}

func (c *tokenConn) Send(m any) error {
	if !c.sent {
		if t := c.sink.Token(); !t.IsZero() {
			c.ResponseHeader().Set(middleware.TokenHeader, t.String())
			c.sent = true
			c.ic.countSet()
		}
	}
	return c.StreamingHandlerConn.Send(m)
}
