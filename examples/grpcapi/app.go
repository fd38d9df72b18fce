package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cuckooguard/cuckooguard/examples/grpcapi/usersv1"
	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/pgmetrics"
	"github.com/cuckooguard/cuckooguard/metrics/rpcmetrics"
	"github.com/cuckooguard/cuckooguard/postgres"
	"github.com/cuckooguard/cuckooguard/rpcguard"
)

// config is what the command line sets for the server.
type config struct {
	DSN         string        // postgres:// URL or SQLite file path
	Rows        int64         // users 1..Rows to seed
	NoGuard     bool          // no interceptor, and GetUser asks the database itself: the load test's baseline
	GuardDetail bool          // the guard's NotFound carries its ErrorInfo (rpcguard.FromGuard), not the handler's status alone
	Heartbeat   time.Duration // the follower's heartbeat (PostgreSQL); 0 for the default
}

// app is the users service over gRPC: a database, a Loader guarding its
// lookups, the interceptor in front of GetUser, and the health service.
// On PostgreSQL it is one replica among many: a postgres.Follower keeps
// its guard in step with the rows the others write.
type app struct {
	db       *userdb.DB
	loader   *guarded.Loader[int64, userdb.User]
	ic       *rpcguard.Interceptor[int64] // nil with NoGuard
	follower *postgres.Follower[int64]    // PostgreSQL
	health   *health.Server
	ready    *rpcguard.Health
	reg      *prometheus.Registry
	srv      *grpc.Server
	log      *slog.Logger
	filled   chan struct{} // closed when the warm-up (or the follower) ends
	draining atomic.Bool   // shutting down: the health status is NOT_SERVING
}

// newApp opens cfg.DSN, seeds users 1..cfg.Rows and builds the service.
// The guard starts empty and passes every lookup through, with the health
// status NOT_SERVING, until warmUp has filled it (SQLite) or the follower
// has read the table (PostgreSQL).
func newApp(ctx context.Context, cfg config, log *slog.Logger) (_ *app, err error) {
	var closers []func() error
	defer func() {
		if err != nil {
			for _, c := range slices.Backward(closers) {
				c()
			}
		}
	}()
	db, err := userdb.Open(ctx, cfg.DSN)
	if err != nil {
		return nil, err
	}
	closers = append(closers, db.Close)
	if err := db.Migrate(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := db.Seed(ctx, cfg.Rows, nil); err != nil {
		return nil, err
	}
	log.Info("database ready", "driver", db.Driver, "rows", cfg.Rows, "took", time.Since(start).Round(time.Millisecond))
	g, err := guard.New(guard.WithCapacity(int(max(cfg.Rows, 1000))))
	if err != nil {
		return nil, err
	}
	closers = append(closers, g.Close)
	replica := db.Driver == "pgx"
	store := guarded.Funcs[int64, userdb.User]{Lookup: db.Lookup}
	if !replica {
		store.ListKeys = db.IDs // on PostgreSQL the follower reads the table
	}
	loader, err := guarded.New(g, store, guarded.WithLogger(log))
	if err != nil {
		return nil, err
	}
	closers = append(closers, loader.Close)
	a := &app{db: db, loader: loader, log: log, filled: make(chan struct{}), reg: prometheus.NewRegistry()}
	if replica {
		if err := a.follow(ctx, cfg); err != nil {
			return nil, err
		}
	}

	// The guard in front of GetUser: ids it has never seen get NotFound
	// without reaching the handler. The NotFound is the handler's own,
	// detail for detail, so a client cannot tell which of the two
	// answered: a NotFound that a handler gives to hide a row (another
	// tenant's) then says no more than an absent id's. GuardDetail adds
	// the guard's ErrorInfo instead, which tells every client which ids
	// the guard knows are absent: for debugging.
	unary := []grpc.UnaryServerInterceptor{}
	if !cfg.NoGuard {
		rejection := rpcguard.WithRejection(userNotFound)
		if cfg.GuardDetail {
			rejection = rpcguard.WithMessage(userNotFound.Message())
		}
		if a.ic, err = rpcguard.New(loader, rpcguard.Keys[int64]{
			usersv1.UserService_GetUser_FullMethodName: rpcguard.Field[int64]("id"),
		}, rejection); err != nil {
			return nil, err
		}
		unary = append(unary, a.ic.Unary())
		a.reg.MustRegister(rpcmetrics.NewInterceptorCollector(a.ic))
	}
	a.srv = grpc.NewServer(grpc.ChainUnaryInterceptor(unary...))
	usersv1.RegisterUserServiceServer(a.srv, &usersServer{a: a})

	// The health service: SERVING while the guard answers on its own,
	// what /readyz says over HTTP in examples/httpapi.
	a.health = health.NewServer()
	if a.ready, err = rpcguard.NewHealth(rpcguard.ReadyFunc(a.isReady), a.health,
		rpcguard.WithServices("", usersv1.UserService_ServiceDesc.ServiceName)); err != nil {
		return nil, err
	}
	healthpb.RegisterHealthServer(a.srv, a.ready.Server(a.health)) // Check asks isReady at the call

	a.reg.MustRegister(collectors.NewGoCollector(), metrics.NewLoaderCollector(loader))
	if a.follower != nil {
		a.reg.MustRegister(pgmetrics.NewFollowerCollector(a.follower))
	}
	return a, nil
}

// follow sets up the replica's follower: a replication slot of its own,
// through the table's publication (postgres.Publish, safe from every
// replica at once).
func (a *app) follow(ctx context.Context, cfg config) error {
	conn, err := pgx.Connect(ctx, cfg.DSN)
	if err != nil {
		return fmt.Errorf("prepare the users table: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	table, err := postgres.Resolve(ctx, conn, "users") // "schema.users"
	if err != nil {
		return fmt.Errorf("prepare the users table: find it: %w", err)
	}
	if err := postgres.Publish(ctx, conn, table, "id"); err != nil {
		return err
	}
	opts := []postgres.Option{postgres.WithLogger(a.log)}
	if cfg.Heartbeat > 0 {
		opts = append(opts, postgres.WithHeartbeat(cfg.Heartbeat))
	}
	parse := func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
	if a.follower, err = postgres.NewFollower(a.loader, cfg.DSN, table, "id", parse, opts...); err != nil {
		return err
	}
	// This replica's inserts are tagged so that its follower skips them:
	// its Loader adds their ids before writing.
	a.db.Tag = a.follower.TagQuery
	return nil
}

// isReady reports whether the guard answers on its own: filled, on
// PostgreSQL with the follower following, and not shutting down.
func (a *app) isReady() bool {
	if a.draining.Load() || !a.loader.Ready() {
		return false
	}
	return a.follower == nil || a.follower.Stats().State == postgres.Following
}

// warmUp fills the guard from SELECT id FROM users, or on PostgreSQL runs
// the follower, and keeps the health status in step, until ctx ends; it
// returns nil then, and an error when the guard cannot be filled.
func (a *app) warmUp(ctx context.Context) error {
	defer close(a.filled)
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	health := make(chan struct{})
	go func() {
		defer close(health)
		a.ready.Run(hctx)
	}()
	defer func() { stop(); <-health }()
	var err error
	if a.follower != nil {
		err = a.follower.Run(ctx)
	} else if err = a.loader.Fill(ctx, a.db.IDs(ctx)); err == nil {
		<-ctx.Done() // filled: the health status stays in step until the end
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// serve serves gRPC on ln until shutdown.
func (a *app) serve(ln net.Listener) error {
	a.log.Info("listening", "addr", ln.Addr().String(), "guard", a.ic != nil)
	return a.srv.Serve(ln)
}

// metricsHandler serves the Prometheus metrics.
func (a *app) metricsHandler() http.Handler {
	return promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)})
}

// shutdown takes the replica out of rotation (NOT_SERVING), stops
// accepting calls, waits up to ctx for those in flight, and closes the
// guard and the database. Stop the warm-up's ctx and wait for filled
// first: the follower uses the Loader.
func (a *app) shutdown(ctx context.Context) {
	a.draining.Store(true)
	a.health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		a.srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		a.srv.Stop()
		<-stopped
	}
	a.loader.Close()
	a.db.Close()
}

// usersServer implements the UserService.
type usersServer struct {
	usersv1.UnimplementedUserServiceServer
	a *app
}

func (s *usersServer) GetUser(ctx context.Context, req *usersv1.GetUserRequest) (*usersv1.User, error) {
	id := req.GetId()
	var (
		u   userdb.User
		err error
	)
	if s.a.ic == nil {
		u, err = s.a.db.Lookup(ctx, id) // no guard: every id costs a query
	} else {
		u, err = s.a.loader.Get(ctx, id)
	}
	if err != nil {
		return nil, s.a.status(ctx, "get user", id, err)
	}
	return &usersv1.User{Id: u.ID, Name: u.Name}, nil
}

func (s *usersServer) CreateUser(ctx context.Context, req *usersv1.CreateUserRequest) (*usersv1.User, error) {
	name := req.GetName()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name must not be empty")
	}
	if req.GetId() == 0 {
		// An id the database generates: the Loader adds the id the
		// INSERT returns before the transaction commits.
		var u userdb.User
		err := s.a.loader.InsertGenerated(ctx, func(ctx context.Context, add func(int64) error) error {
			var err error
			u, err = s.a.db.InsertGenerated(ctx, name, add)
			return err
		})
		if err != nil {
			return nil, s.a.status(ctx, "create user", u.ID, err)
		}
		return &usersv1.User{Id: u.ID, Name: u.Name}, nil
	}
	u := userdb.User{ID: req.GetId(), Name: name}
	// The guard gets the id before the row becomes visible, so a GetUser
	// right after this call never meets a stale "absent".
	err := s.a.loader.Insert(ctx, u.ID, func(ctx context.Context) error { return s.a.db.Insert(ctx, u) })
	if errors.Is(err, userdb.ErrExists) {
		return nil, status.Errorf(codes.AlreadyExists, "user %d exists", u.ID)
	}
	if err != nil {
		return nil, s.a.status(ctx, "create user", u.ID, err)
	}
	return &usersv1.User{Id: u.ID, Name: u.Name}, nil
}

func (s *usersServer) DeleteUser(ctx context.Context, req *usersv1.DeleteUserRequest) (*usersv1.DeleteUserResponse, error) {
	id := req.GetId()
	var existed bool
	err := s.a.loader.Delete(ctx, id, func(ctx context.Context) (bool, error) {
		var err error
		existed, err = s.a.db.Delete(ctx, id)
		return existed, err
	})
	if err != nil {
		return nil, s.a.status(ctx, "delete user", id, err)
	}
	if !existed {
		return nil, userNotFound.Err()
	}
	return &usersv1.DeleteUserResponse{}, nil
}

// userNotFound is the service's answer for a user it does not find: the
// handlers' and, unless GuardDetail, the guard's.
var userNotFound = status.New(codes.NotFound, "user not found")

// status turns a database or Loader error into the call's status:
// NotFound, Unavailable while the database cannot be reached, Internal
// otherwise.
func (a *app) status(ctx context.Context, op string, id int64, err error) error {
	switch {
	case errors.Is(err, guarded.ErrNotFound), errors.Is(err, sql.ErrNoRows):
		return userNotFound.Err()
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case userdb.Unavailable(err):
		a.log.WarnContext(ctx, op+": database unavailable", "id", id, "error", err)
		return status.Error(codes.Unavailable, "the database is not available; try again")
	}
	a.log.ErrorContext(ctx, op, "id", id, "error", err)
	return status.Error(codes.Internal, "internal error")
}
