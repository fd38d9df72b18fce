package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cuckooguard/cuckooguard/examples/grpcapi/usersv1"
	"github.com/cuckooguard/cuckooguard/rpcguard"
)

// dial returns a connection to the server at addr, without TLS.
func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// clientCmd runs the client's command cmd (get, create, delete, health)
// with args, and prints the answer to w. An answer of the service, a
// NotFound included, is a success; an error is what the call could not
// do (the server cannot be reached, an invalid argument).
func clientCmd(cmd string, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("grpcapi "+cmd, flag.ContinueOnError)
	addr := fs.String("addr", defaultAddr, "the server's address")
	timeout := fs.Duration("timeout", 10*time.Second, "how long the call may take")
	var id *int64
	var wait *time.Duration
	var service *string
	switch cmd {
	case "create":
		id = fs.Int64("id", 0, "the new user's id (default: one the database generates)")
	case "health":
		wait = fs.Duration("wait", 0, "wait up to this long for SERVING, watching the status (default: check once)")
		service = fs.String("service", "", `the service whose status to ask ("" for the server as a whole)`)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	cc, err := dial(*addr)
	if err != nil {
		return err
	}
	defer cc.Close()
	limit := *timeout
	if wait != nil && *wait > limit {
		limit = *wait
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	users := usersv1.NewUserServiceClient(cc)
	arg := func() (string, error) {
		if fs.NArg() != 1 {
			return "", fmt.Errorf("want one argument, got %q", fs.Args())
		}
		return fs.Arg(0), nil
	}
	idArg := func() (int64, error) {
		s, err := arg()
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(s, 10, 64)
	}
	switch cmd {
	case "get":
		n, err := idArg()
		if err != nil {
			return err
		}
		u, err := users.GetUser(ctx, &usersv1.GetUserRequest{Id: n})
		return printUser(w, u, err)
	case "create":
		name, err := arg()
		if err != nil {
			return err
		}
		u, err := users.CreateUser(ctx, &usersv1.CreateUserRequest{Id: *id, Name: name})
		return printUser(w, u, err)
	case "delete":
		n, err := idArg()
		if err != nil {
			return err
		}
		_, err = users.DeleteUser(ctx, &usersv1.DeleteUserRequest{Id: n})
		if err == nil {
			fmt.Fprintln(w, "deleted")
		}
		return printStatus(w, err)
	case "health":
		if fs.NArg() != 0 {
			return fmt.Errorf("unexpected arguments %q", fs.Args())
		}
		return printHealth(ctx, w, healthpb.NewHealthClient(cc), *service, *wait > 0)
	}
	return fmt.Errorf("unknown command %q", cmd)
}

// printUser prints u as JSON, or the status of err.
func printUser(w io.Writer, u *usersv1.User, err error) error {
	if err != nil {
		return printStatus(w, err)
	}
	b, err := json.Marshal(struct {
		ID   int64  `json:"id"`
		Name string `json:"name"`
	}{u.GetId(), u.GetName()})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// printStatus prints the status of err if it is an answer of the service
// (NotFound, AlreadyExists), and returns err otherwise. A NotFound of the
// guard is the handler's own unless the server runs with -guard-detail:
// then its ErrorInfo says that the guard gave it, and so does the line.
func printStatus(w io.Writer, err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.NotFound, codes.AlreadyExists:
		by := ""
		if rpcguard.FromGuard(err) {
			by = " (answered by the guard, without the handler)"
		}
		_, err := fmt.Fprintf(w, "%v: %s%s\n", st.Code(), st.Message(), by)
		return err
	}
	return err
}

// printHealth prints the health status of service; with wait, it watches
// the status until it is SERVING (or ctx ends).
func printHealth(ctx context.Context, w io.Writer, hc healthpb.HealthClient, service string, wait bool) error {
	req := &healthpb.HealthCheckRequest{Service: service}
	if !wait {
		resp, err := hc.Check(ctx, req)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, resp.GetStatus())
		return err
	}
	for {
		// Watch streams the status as it changes; a server that is not
		// up yet is waited for, as a probe retries.
		stream, err := hc.Watch(ctx, req, grpc.WaitForReady(true))
		if err != nil {
			return err
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("not SERVING: %w", ctx.Err())
				}
				if status.Code(err) == codes.Unavailable {
					break // the server went away: watch again
				}
				return err
			}
			if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				_, err := fmt.Fprintln(w, resp.GetStatus())
				return err
			}
		}
		select {
		case <-ctx.Done():
			return errors.New("not SERVING: " + ctx.Err().Error())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
