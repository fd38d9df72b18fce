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

// setRejection sets the gRPC error and the Connect code, message and
// details of a rejection: c's WithRejection status, or NotFound with c's
// message and the guard's ErrorInfo.
func (ic *Interceptor[K]) setRejection(c config) error {
	st := c.rejection
	if st == nil {
		var err error
		info := &errdetails.ErrorInfo{Reason: ErrorReason, Domain: ErrorDomain}
		if st, err = status.New(codes.NotFound, c.message).WithDetails(info); err != nil {
			return fmt.Errorf("rpcguard: the rejection's status: %w", err)
		}
	} else if st.Code() == codes.OK {
		return errors.New("rpcguard: New: WithRejection: the status is OK, which is no rejection")
	}
	ic.grpcErr = st.Err()
	ic.connectCode = connect.Code(st.Code())
	ic.message = errors.New(st.Message())
	ic.errorDetails = nil
	for _, d := range st.Proto().GetDetails() {
		detail, err := connect.NewErrorDetail(d)
		if err != nil {
			return fmt.Errorf("rpcguard: the rejection's error detail: %w", err)
		}
		ic.errorDetails = append(ic.errorDetails, detail)
	}
	return nil
}

// connectErr returns a new Connect rejection. A *connect.Error is not
// shared between requests, as the gRPC one is: its Meta can be written
// to.
func (ic *Interceptor[K]) connectErr() error {
	err := connect.NewError(ic.connectCode, ic.message)
	for _, d := range ic.errorDetails {
		err.AddDetail(d)
	}
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
