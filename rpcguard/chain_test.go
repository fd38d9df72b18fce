package rpcguard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cuckooguard/cuckooguard/rpcguard"
)

// logLine is one line of go-grpc-middleware's logging, its fields by key.
type logLine struct {
	msg    string
	fields map[string]any
}

// recorder is a logging.Logger that keeps the lines.
type recorder struct {
	mu    sync.Mutex // protects lines
	lines []logLine
}

func (r *recorder) Log(_ context.Context, _ logging.Level, msg string, fields ...any) {
	l := logLine{msg: msg, fields: make(map[string]any)}
	for i := 0; i+1 < len(fields); i += 2 {
		l.fields[fmt.Sprint(fields[i])] = fields[i+1]
	}
	r.mu.Lock()
	r.lines = append(r.lines, l)
	r.mu.Unlock()
}

// finished returns the "finished call" lines of method.
func (r *recorder) finished(method string) []logLine {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []logLine
	for _, l := range r.lines {
		if l.msg == "finished call" && l.fields["grpc.method"] == method {
			out = append(out, l)
		}
	}
	return out
}

// TestChainWithGoGRPCMiddleware chains the interceptors with
// go-grpc-middleware's logging and recovery, as a service would:
// grpc.ChainUnaryInterceptor(logging, recovery, rpcguard). The guard's
// NotFound is logged with the code and a field that says the guard
// answered; a handler's panic behind the guard becomes recovery's
// Internal; known ids reach the handler.
func TestChainWithGoGRPCMiddleware(t *testing.T) {
	s := newStore(100)
	s.names[panicID] = "panics" // the guard passes it, and the handler panics
	loader := newLoader(t, s, true)
	ic, err := rpcguard.New(loader, rpcguard.Keys[int64]{
		getUser:   rpcguard.Field[int64]("id"),
		watchUser: rpcguard.Field[int64]("id"),
	})
	if err != nil {
		t.Fatal(err)
	}
	var logs recorder
	// The guard's answer in the log: one field from the error's
	// ErrorInfo.
	guardField := logging.WithErrorFields(func(err error) logging.Fields {
		if rpcguard.FromGuard(err) {
			return logging.Fields{"cuckooguard.guard", "absent"}
		}
		return nil
	})
	// A panic becomes Internal, without the stack (which the default
	// sends to the client).
	internal := recovery.WithRecoveryHandler(func(p any) error { return status.Errorf(codes.Internal, "panic: %v", p) })
	srv := startServer(t, "grpc", &service{s: s, loader: loader}, serverConfig{
		unary: []grpc.UnaryServerInterceptor{
			logging.UnaryServerInterceptor(&logs, guardField),
			recovery.UnaryServerInterceptor(internal),
			ic.Unary(),
		},
		stream: []grpc.StreamServerInterceptor{
			logging.StreamServerInterceptor(&logs, guardField),
			recovery.StreamServerInterceptor(internal),
			ic.Stream(),
		},
	})
	ctx := testCtx(t)
	c := srv.client

	if _, err := c.GetUser(ctx, 42); err != nil {
		t.Fatalf("GetUser(42): %v", err)
	}
	if _, err := c.GetUser(ctx, unknownID); !rpcguard.FromGuard(err) {
		t.Fatalf("GetUser(unknown) = %v, want the guard's NotFound", err)
	}
	if _, err := c.GetUser(ctx, panicID); status.Code(err) != codes.Internal {
		t.Fatalf("GetUser(%d), whose handler panics: %v, want recovery's Internal", panicID, err)
	}
	if _, err := c.WatchUser(ctx, unknownID); !rpcguard.FromGuard(err) {
		t.Fatalf("WatchUser(unknown) = %v, want the guard's NotFound", err)
	}
	if _, err := c.WatchUser(ctx, panicID); status.Code(err) != codes.Internal {
		t.Fatalf("WatchUser(%d), whose handler panics: %v, want recovery's Internal", panicID, err)
	}
	if got := s.callsOf("GetUser"); got != 2 {
		t.Errorf("GetUser's handler ran %d times, want 2 (42 and %d)", got, panicID)
	}

	for _, tc := range []struct {
		method string
		codes  []string // of the finished calls, in order
		guard  []bool   // whether each line says the guard answered
	}{
		{"GetUser", []string{"OK", "NotFound", "Internal"}, []bool{false, true, false}},
		{"WatchUser", []string{"NotFound", "Internal"}, []bool{true, false}},
	} {
		lines := logs.finished(tc.method)
		if len(lines) != len(tc.codes) {
			t.Fatalf("%s: %d finished calls logged, want %d: %v", tc.method, len(lines), len(tc.codes), lines)
		}
		for i, l := range lines {
			if l.fields["grpc.code"] != tc.codes[i] {
				t.Errorf("%s call %d: logged code %v, want %s", tc.method, i, l.fields["grpc.code"], tc.codes[i])
			}
			if _, ok := l.fields["cuckooguard.guard"]; ok != tc.guard[i] {
				t.Errorf("%s call %d: the guard's field logged: %v, want %v (%v)", tc.method, i, ok, tc.guard[i], l.fields)
			}
		}
	}
	checkStats(t, "ids", ic.Stats(), rpcguard.Stats{Methods: map[string]rpcguard.MethodStats{
		getUser:   {Rejected: 1, Passed: 2},
		watchUser: {Rejected: 1, Passed: 1},
	}})
}

// TestChainOrder: with the guard first in the chain, a rejected request
// reaches none of the interceptors after it, and they see the others as
// before.
func TestChainOrder(t *testing.T) {
	s := newStore(100)
	loader := newLoader(t, s, true)
	ic, err := rpcguard.New(loader, rpcguard.Keys[int64]{getUser: rpcguard.Field[int64]("id")})
	if err != nil {
		t.Fatal(err)
	}
	var logs recorder
	srv := startServer(t, "grpc", &service{s: s, loader: loader}, serverConfig{
		unary: []grpc.UnaryServerInterceptor{ic.Unary(), logging.UnaryServerInterceptor(&logs), recovery.UnaryServerInterceptor()},
	})
	ctx := testCtx(t)
	if _, err := srv.client.GetUser(ctx, unknownID); !rpcguard.FromGuard(err) {
		t.Fatalf("GetUser(unknown) = %v, want the guard's NotFound", err)
	}
	if _, err := srv.client.GetUser(ctx, 7); err != nil {
		t.Fatalf("GetUser(7): %v", err)
	}
	if lines := logs.finished("GetUser"); len(lines) != 1 || lines[0].fields["grpc.code"] != "OK" {
		t.Fatalf("logged %v, want GetUser(7) alone", lines)
	}
}
