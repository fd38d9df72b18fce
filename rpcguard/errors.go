package rpcguard

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The google.rpc.ErrorInfo that every rejection carries, so that a client
// (or a log) can tell the guard's NotFound from the handler's: [FromGuard]
// reads it.
const (
	ErrorReason = "KEY_ABSENT"                         // ErrorInfo.reason: the guard knows the key is absent
	ErrorDomain = "github.com/cuckooguard/cuckooguard" // ErrorInfo.domain
)

// rejection returns the gRPC error, and the Connect error detail, of a
// rejection with message msg.
func rejection(msg string) (error, *connect.ErrorDetail, error) {
	info := &errdetails.ErrorInfo{Reason: ErrorReason, Domain: ErrorDomain}
	st, err := status.New(codes.NotFound, msg).WithDetails(info)
	if err != nil {
		return nil, nil, fmt.Errorf("rpcguard: the rejection's status: %w", err)
	}
	detail, err := connect.NewErrorDetail(info)
	if err != nil {
		return nil, nil, fmt.Errorf("rpcguard: the rejection's error detail: %w", err)
	}
	return st.Err(), detail, nil
}

// connectErr returns a new Connect rejection. A *connect.Error is not
// shared between requests, as the gRPC one is: its Meta can be written
// to.
func (ic *Interceptor[K]) connectErr() error {
	err := connect.NewError(connect.CodeNotFound, ic.message)
	err.AddDetail(ic.errorDetail)
	return err
}

// FromGuard reports whether err, an error a gRPC or Connect client
// received, is the NotFound of an Interceptor: the guard knew the key was
// absent and the handler did not run. It is false for a handler's own
// NotFound, and for every other error.
func FromGuard(err error) bool {
	if err == nil {
		return false
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		if ce.Code() != connect.CodeNotFound {
			return false
		}
		for _, d := range ce.Details() {
			if v, err := d.Value(); err == nil && isGuardInfo(v) {
				return true
			}
		}
		return false
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.NotFound {
		return false
	}
	for _, d := range st.Details() {
		if isGuardInfo(d) {
			return true
		}
	}
	return false
}

func isGuardInfo(v any) bool {
	info, ok := v.(*errdetails.ErrorInfo)
	return ok && info.GetReason() == ErrorReason && info.GetDomain() == ErrorDomain
}
