package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/fanout"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/metrics"
	"github.com/cuckooguard/cuckooguard/metrics/fanoutmetrics"
	"github.com/cuckooguard/cuckooguard/metrics/pgmetrics"
	"github.com/cuckooguard/cuckooguard/middleware"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// app is the users service: a database, a Loader guarding its lookups and
// the HTTP routes. On PostgreSQL it is one replica among many: a Follower
// keeps its guard in step with the rows the others write.
type app struct {
	db       *userdb.DB
	loader   *guarded.Loader[int64, userdb.User]
	mw       *middleware.Middleware[int64]
	follower *postgres.Follower[int64] // PostgreSQL, following the table directly
	relayed  *fanout.Follower[int64]   // PostgreSQL with -nats: following the relay's stream
	relay    *fanout.Relay             // with -nats: this replica relays while it holds the relay's lock
	nc       *nats.Conn
	log      *slog.Logger
	srv      *http.Server
	filled   chan struct{} // closed when the warm-up (or the follower) ends
	draining atomic.Bool   // shutting down: /readyz answers 503
}

// config is what the command line sets.
type config struct {
	DSN       string        // postgres:// URL or SQLite file path
	Rows      int64         // users 1..Rows to seed
	Origin    string        // this replica's origin (PostgreSQL); unique among the processes running
	Heartbeat time.Duration // the follower's heartbeat (PostgreSQL); 0 for the default
	Notify    bool          // follow through the trigger and NOTIFY instead of logical decoding
	Snapshot  string        // the follower's snapshot file (logical decoding); "" for none
	NATS      string        // follow through a relay and NATS JetStream at this URL; "" to follow the database directly
	Service   string        // the relay's name with NATS: one relay, and one slot, per service and database for all its tables
}

// newApp opens cfg.DSN, seeds users 1..cfg.Rows and builds the service.
// The guard starts empty and passes every lookup through until warmUp has
// filled it (SQLite) or the follower has read the table (PostgreSQL).
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
	replica := db.Driver == "pgx"
	var table string
	if replica {
		// The publication (or the trigger, with -notify), safe from every
		// replica at once. The table is named with its schema, so that
		// services with a users table in another schema of this database
		// do not collide.
		if table, err = prepareTable(ctx, cfg.DSN, cfg.Notify); err != nil {
			return nil, err
		}
	}
	g, err := guard.New(guard.WithCapacity(int(max(cfg.Rows, 1000))))
	if err != nil {
		return nil, err
	}
	closers = append(closers, g.Close)
	store := guarded.Funcs[int64, userdb.User]{Lookup: db.Lookup, LookupMany: db.LookupMany}
	if !replica {
		// On PostgreSQL the follower reads the table, under a snapshot
		// that tells which changes the read saw.
		store.ListKeys = db.IDs
	}
	loader, err := guarded.New(g, store, guarded.WithLogger(log))
	if err != nil {
		return nil, err
	}
	closers = append(closers, loader.Close)
	a := &app{db: db, loader: loader, log: log, filled: make(chan struct{})}
	if replica {
		closers = append(closers, func() error { a.closeNATS(); return nil })
		if err := a.follow(cfg, table); err != nil {
			return nil, err
		}
	}
	if a.mw, err = middleware.New(loader, middleware.Int64(middleware.PathValue("id"))); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics.NewLoaderCollector(loader),
		metrics.NewMiddlewareCollector(a.mw),
	)
	if a.follower != nil {
		reg.MustRegister(pgmetrics.NewFollowerCollector(a.follower))
	}
	if a.relayed != nil {
		reg.MustRegister(fanoutmetrics.NewFollowerCollector(a.relayed), fanoutmetrics.NewRelayCollector(a.relay))
	}
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", a.mw.Wrap(http.HandlerFunc(a.getUser)))
	// Many ids at once: not for the middleware, which filters one key per
	// request; the handler's GetMany answers absent ids from the guard.
	mux.HandleFunc("GET /users", a.getUsers)
	mux.HandleFunc("POST /users", a.createUser)
	mux.HandleFunc("DELETE /users/{id}", a.deleteUser)
	mux.HandleFunc("GET /debug/vars", a.vars)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}))
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	a.srv = &http.Server{
		Handler: problemRouter(mux),
		// A slow or stuck client cannot hold a connection and its
		// goroutine for long: the request must arrive within
		// ReadTimeout, and an idle keep-alive connection closes after
		// IdleTimeout.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return a, nil
}

// prepareTable publishes the users table's key column for logical
// decoding (postgres.Publish) or, with notify, installs the trigger that
// publishes its changes (postgres.Install), and returns the table's
// schema-qualified name.
func prepareTable(ctx context.Context, dsn string, notify bool) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", fmt.Errorf("prepare the users table: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	table, err := postgres.Resolve(ctx, conn, "users") // "schema.users"
	if err != nil {
		return "", fmt.Errorf("prepare the users table: find it: %w", err)
	}
	if notify {
		return table, postgres.Install(ctx, conn, table, "id")
	}
	return table, postgres.Publish(ctx, conn, table, "id")
}

// maxBody is the largest request body the service reads.
const maxBody = 1 << 16

// warmUp fills the guard from SELECT id FROM users, or on PostgreSQL runs
// the follower until ctx ends; until the guard is filled it passes every
// lookup to the database. It returns nil when ctx ends, and an error when
// the guard cannot be filled (the service would pass every lookup through
// for good: better to stop and say why).
func (a *app) warmUp(ctx context.Context) error {
	defer close(a.filled)
	var err error
	switch {
	case a.relayed != nil:
		// The relay and the follower until ctx ends: every replica may
		// relay, one at a time, and follows the stream.
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error { return a.relay.Run(gctx) })
		g.Go(func() error { return a.relayed.Run(gctx) })
		err = g.Wait()
	case a.follower != nil:
		err = a.follower.Run(ctx)
	default:
		err = a.loader.Fill(ctx, a.db.IDs(ctx))
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// serve serves HTTP on ln until Shutdown.
func (a *app) serve(ln net.Listener) error {
	a.log.Info("listening", "addr", ln.Addr().String())
	if err := a.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// shutdown stops accepting requests, waits for those in flight, and closes
// the guard and the database. Stop the follower (the warm-up's ctx) and
// wait for filled first: it uses the Loader.
func (a *app) shutdown(ctx context.Context) error {
	a.draining.Store(true)
	err := a.srv.Shutdown(ctx)
	a.loader.Close()
	a.closeNATS()
	a.db.Close()
	return err
}

// healthz answers 200 while the process serves: a liveness probe. It does
// not look at the database or the guard; restarting the process would not
// fix either.
func (a *app) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok\n")
}

// readiness is the body of /readyz.
type readiness struct {
	Ready    bool   `json:"ready"`
	Guard    string `json:"guard"`              // "ready", or "passing through" (filling, resyncing, behind)
	Follower string `json:"follower,omitempty"` // the follower's state, on PostgreSQL
	// FollowerError is why the follower's last session failed, while it
	// does not follow: its postgres.Reason and error.
	FollowerError string `json:"follower_error,omitempty"`
	Draining      bool   `json:"draining,omitempty"` // shutting down
}

// readyz answers 200 when the guard answers on its own (filled, and on
// PostgreSQL the follower is following), 503 otherwise and while shutting
// down: a readiness probe. An instance that is not ready still answers
// correctly, by asking the database about every id; the probe keeps such
// instances out of rotation so that the database does not take their load.
func (a *app) readyz(w http.ResponseWriter, r *http.Request) {
	st := readiness{Ready: a.loader.Ready(), Guard: "ready", Draining: a.draining.Load()}
	if !st.Ready {
		st.Guard = "passing through"
	}
	if a.follower != nil {
		fs := a.follower.Stats()
		st.Follower = fs.State.String()
		st.Ready = st.Ready && fs.State == postgres.Following
		if fs.State != postgres.Following && fs.LastError != nil {
			st.FollowerError = string(fs.LastErrorReason) + ": " + fs.LastError.Error()
		}
	}
	if a.relayed != nil {
		fs := a.relayed.Stats()
		st.Follower = fs.State.String()
		st.Ready = st.Ready && fs.State == postgres.Following
		if fs.State != postgres.Following && fs.LastError != nil {
			st.FollowerError = fs.LastError.Error()
		}
	}
	st.Ready = st.Ready && !st.Draining
	code := http.StatusOK
	if !st.Ready {
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, code, st)
}

func (a *app) getUser(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		problem(w, http.StatusBadRequest, "id must be an integer")
		return
	}
	u, err := a.loader.Get(r.Context(), id)
	switch {
	case errors.Is(err, guarded.ErrNotFound):
		problem(w, http.StatusNotFound, "")
	case err != nil:
		a.storeError(w, r, "get user", id, err)
	default:
		writeJSON(w, http.StatusOK, u)
	}
}

// maxBatch is the most ids GET /users?ids= takes.
const maxBatch = 1000

// usersResponse is the body of GET /users?ids=…: the users that exist, in
// the order asked, and the ids that do not.
type usersResponse struct {
	Users   []userdb.User `json:"users"`
	Missing []int64       `json:"missing"`
}

// getUsers serves GET /users?ids=1,2,3: one GetMany, so ids the guard
// knows are absent cost nothing and the others one query.
func (a *app) getUsers(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query().Get("ids")
	if raw == "" {
		problem(w, http.StatusBadRequest, "ids must be a comma-separated list of integers")
		return
	}
	parts := strings.Split(raw, ",")
	if len(parts) > maxBatch {
		problem(w, http.StatusBadRequest, fmt.Sprintf("at most %d ids per request", maxBatch))
		return
	}
	ids := make([]int64, len(parts))
	for i, p := range parts {
		id, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
		if err != nil {
			problem(w, http.StatusBadRequest, fmt.Sprintf("id %q is not an integer", p))
			return
		}
		ids[i] = id
	}
	users, errs := a.loader.GetMany(r.Context(), ids)
	resp := usersResponse{Users: []userdb.User{}, Missing: []int64{}}
	for i, err := range errs {
		switch {
		case err == nil:
			resp.Users = append(resp.Users, users[i])
		case errors.Is(err, guarded.ErrNotFound):
			resp.Missing = append(resp.Missing, ids[i])
		default:
			a.storeError(w, r, "get users", ids[i], err)
			return
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// createRequest is the body of POST /users: {"id": 42, "name": "Ada"}, the
// shape GET /users/{id} answers, so that a client can send back what it
// read. The id may also be a string of digits, {"id": "42"}, as clients of
// earlier versions sent it, or absent (or null): the database generates
// one.
type createRequest struct {
	ID   *userID `json:"id"` // nil: missing or null
	Name string  `json:"name"`
}

// userID is an id in a request body: a JSON integer or a string of
// digits. It is parsed from the text, so ids beyond 2^53 keep every digit
// (a float64 would round them).
type userID int64

func (u *userID) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("id %s is not an integer", b)
	}
	*u = userID(n)
	return nil
}

// errBodyTooLarge is the answer to a body over maxBody.
var errBodyTooLarge = errors.New("body too large")

// decodeCreate reads one JSON object of at most maxBody bytes, in valid
// UTF-8 and with nothing after it.
func decodeCreate(w http.ResponseWriter, r *http.Request) (createRequest, error) {
	var req createRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return req, errBodyTooLarge
		}
		return req, err
	}
	// encoding/json would turn invalid UTF-8 into U+FFFD silently.
	if !utf8.Valid(body) {
		return req, errors.New("body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	// The service owns its schema: a field it does not know is a client's
	// mistake (a misspelt "name", a field of a newer API), not something
	// to drop silently while answering 201.
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, err
	}
	if dec.Decode(new(json.RawMessage)) != io.EOF {
		return req, errors.New("body has data after the JSON object")
	}
	return req, nil
}

func (a *app) createUser(w http.ResponseWriter, r *http.Request) {
	req, err := decodeCreate(w, r)
	switch {
	case errors.Is(err, errBodyTooLarge):
		problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body must be at most %d bytes", maxBody))
		return
	case err != nil:
		problem(w, http.StatusBadRequest, "body must be one JSON object like {\"id\": 42, \"name\": \"Ada\"}: "+err.Error())
		return
	}
	if req.Name == "" || strings.ContainsRune(req.Name, 0) {
		problem(w, http.StatusBadRequest, "name must be a non-empty string without NUL characters, and id an integer or absent")
		return
	}
	if req.ID == nil {
		a.createGenerated(w, r, req.Name)
		return
	}
	id := int64(*req.ID)
	u := userdb.User{ID: id, Name: req.Name}
	// The guard gets the id before the row becomes visible, so a GET
	// right after this POST never meets a stale "absent". If the write's
	// outcome is unknown (the client left, the connection broke), the
	// Loader keeps the id: the row may exist.
	err = a.loader.Insert(r.Context(), id, func(ctx context.Context) error { return a.db.Insert(ctx, u) })
	switch {
	case errors.Is(err, userdb.ErrExists):
		problem(w, http.StatusConflict, "a user with this id exists")
	case err != nil:
		a.storeError(w, r, "create user", id, err)
	default:
		w.Header().Set("Location", "/users/"+strconv.FormatInt(id, 10))
		writeJSON(w, http.StatusCreated, u)
	}
}

// createGenerated creates a user whose id the database generates (an
// identity column): the Loader adds the id the INSERT returns before the
// transaction commits, and the transaction names it for the follower.
func (a *app) createGenerated(w http.ResponseWriter, r *http.Request, name string) {
	var u userdb.User
	err := a.loader.InsertGenerated(r.Context(), func(ctx context.Context, add func(int64) error) error {
		var err error
		u, err = a.db.InsertGenerated(ctx, name, add)
		return err
	})
	if err != nil {
		a.storeError(w, r, "create user", u.ID, err)
		return
	}
	w.Header().Set("Location", "/users/"+strconv.FormatInt(u.ID, 10))
	writeJSON(w, http.StatusCreated, u)
}

func (a *app) deleteUser(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		problem(w, http.StatusBadRequest, "id must be an integer")
		return
	}
	var existed bool
	err = a.loader.Delete(r.Context(), id, func(ctx context.Context) (bool, error) {
		var err error
		existed, err = a.db.Delete(ctx, id)
		return existed, err
	})
	switch {
	case err != nil:
		a.storeError(w, r, "delete user", id, err)
	case !existed:
		problem(w, http.StatusNotFound, "")
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// storeError answers a request whose database call failed: 503 with
// Retry-After while the database cannot be reached (or the call ran out
// of time), 500 otherwise.
func (a *app) storeError(w http.ResponseWriter, r *http.Request, op string, id int64, err error) {
	if r.Context().Err() != nil {
		return // the client left; nobody reads the answer
	}
	if userdb.Unavailable(err) {
		a.log.WarnContext(r.Context(), op+": database unavailable", "id", id, "error", err)
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "the database is not available; try again")
		return
	}
	a.log.ErrorContext(r.Context(), op, "id", id, "error", err)
	problem(w, http.StatusInternalServerError, "")
}

// problemRouter answers the requests that mux has no route for (404) or no
// method for (405, with its Allow header) with the same problem+json body
// as every other error, instead of ServeMux's plain text.
func problemRouter(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(&problemWriter{ResponseWriter: w}, r)
	})
}

// problemWriter turns an error status written by ServeMux into a
// problem+json answer and drops ServeMux's own body.
type problemWriter struct {
	http.ResponseWriter
	replaced bool
}

func (p *problemWriter) WriteHeader(status int) {
	if status < 400 {
		p.ResponseWriter.WriteHeader(status)
		return
	}
	p.replaced = true
	p.Header().Del("X-Content-Type-Options")
	problem(p.ResponseWriter, status, "")
}

func (p *problemWriter) Write(b []byte) (int, error) {
	if p.replaced {
		return len(b), nil
	}
	return p.ResponseWriter.Write(b)
}

// guardVars is the "cuckooguard" object of /debug/vars.
func (a *app) guardVars() map[string]any {
	ls, ms := a.loader.Stats(), a.mw.Stats()
	return map[string]any{
		"ready":              ls.Ready,
		"items":              ls.Guard.Items,
		"rejected":           ms.Rejected,
		"passed":             ms.Passed,
		"store_calls":        ls.StoreCalls,
		"db_lookups":         a.db.Lookups.Load(),
		"avoided":            ls.Avoided,               // the Loader's 404s without a query (GetMany), as /metrics' lookups_total{result="avoided"}
		"without_db":         ls.Avoided + ms.Rejected, // 404s without a query: the middleware's (GET /users/{id}) and the Loader's
		"false_positives":    ls.FalsePositives + ls.NegativeCacheHits,
		"observed_fpr":       observedFPR(ls.FalsePositives+ls.NegativeCacheHits, ls.Avoided+ms.Rejected),
		"estimated_fpr":      ls.Guard.EstimatedFPR,
		"bits_per_item":      ls.Guard.BitsPerItem,
		"doublings":          ls.Guard.Doublings,
		"rebuilds":           ls.Rebuilds,
		"pass_through_shard": ls.PassThroughShards,
	}
}

// observedFPR is the share of absent-key lookups the guard let through:
// falsePos of falsePos + avoided, where avoided counts both paths that
// answer 404 without the database (the middleware and the Loader).
func observedFPR(falsePos, avoided uint64) float64 {
	if falsePos+avoided == 0 {
		return 0
	}
	return float64(falsePos) / float64(falsePos+avoided)
}

// vars serves what expvar.Handler serves plus the "cuckooguard" object,
// without registering it globally (so that tests can run several apps).
func (a *app) vars(w http.ResponseWriter, r *http.Request) {
	out := map[string]any{"cuckooguard": a.guardVars()}
	expvar.Do(func(kv expvar.KeyValue) { out[kv.Key] = json.RawMessage(kv.Value.String()) })
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// problem writes an RFC 9457 problem+json response.
func problem(w http.ResponseWriter, status int, detail string) {
	body := map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status}
	if detail != "" {
		body["detail"] = detail
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}
