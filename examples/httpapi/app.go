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
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/middleware"
)

// app is the users service: a database, a Loader guarding its lookups and
// the HTTP routes.
type app struct {
	db     *userdb.DB
	loader *guard.Loader[int64, userdb.User]
	mw     *middleware.Middleware[int64]
	log    *slog.Logger
	srv    *http.Server
	filled chan struct{} // closed when the warm-up ends
}

// newApp opens dsn, seeds users 1..rows and builds the service. The guard
// starts empty and passes every lookup through until warmUp has run.
func newApp(ctx context.Context, dsn string, rows int64, log *slog.Logger) (*app, error) {
	db, err := userdb.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if err := db.Migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	start := time.Now()
	if err := db.Seed(ctx, rows, nil); err != nil {
		db.Close()
		return nil, err
	}
	log.Info("database ready", "driver", db.Driver, "rows", rows, "took", time.Since(start).Round(time.Millisecond))
	g, err := guard.New(guard.WithCapacity(int(max(rows, 1000))))
	if err != nil {
		db.Close()
		return nil, err
	}
	loader, err := guard.NewLoader(g, db.Lookup, guard.WithKeySource(db.IDs), guard.WithBatchLookup(db.LookupMany), guard.WithLogger(log))
	if err != nil {
		g.Close()
		db.Close()
		return nil, err
	}
	mw, err := middleware.New(loader, middleware.Int64(middleware.PathValue("id")))
	if err != nil {
		loader.Close()
		db.Close()
		return nil, err
	}
	a := &app{db: db, loader: loader, mw: mw, log: log, filled: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", mw.Wrap(http.HandlerFunc(a.getUser)))
	// Many ids at once: not for the middleware, which filters one key per
	// request; the handler's GetMany answers absent ids from the guard.
	mux.HandleFunc("GET /users", a.getUsers)
	mux.HandleFunc("POST /users", a.createUser)
	mux.HandleFunc("DELETE /users/{id}", a.deleteUser)
	mux.HandleFunc("GET /debug/vars", a.vars)
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

// maxBody is the largest request body the service reads.
const maxBody = 1 << 16

// warmUp fills the guard from SELECT id FROM users; until it returns the
// guard passes every lookup to the database.
func (a *app) warmUp(ctx context.Context) error {
	defer close(a.filled)
	return a.loader.Fill(ctx, a.db.IDs(ctx))
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
// the guard and the database.
func (a *app) shutdown(ctx context.Context) error {
	err := a.srv.Shutdown(ctx)
	a.loader.Close()
	a.db.Close()
	return err
}

func (a *app) getUser(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		problem(w, http.StatusBadRequest, "id must be an integer")
		return
	}
	u, err := a.loader.Get(r.Context(), id)
	switch {
	case errors.Is(err, guard.ErrNotFound):
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
		case errors.Is(err, guard.ErrNotFound):
			resp.Missing = append(resp.Missing, ids[i])
		default:
			a.storeError(w, r, "get users", ids[i], err)
			return
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// createRequest is the body of POST /users. The id is a string of digits,
// as in {"id": "42", "name": "Ada"}.
type createRequest struct {
	ID   string `json:"id"`
	Name string `json:"name"`
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
		problem(w, http.StatusBadRequest, "body must be one JSON object like {\"id\": \"42\", \"name\": \"Ada\"}: "+err.Error())
		return
	}
	id, err := strconv.ParseInt(req.ID, 10, 64)
	if err != nil || req.Name == "" || strings.ContainsRune(req.Name, 0) {
		problem(w, http.StatusBadRequest, "id must be an integer and name a non-empty string without NUL characters")
		return
	}
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
		w.Header().Set("Location", "/users/"+req.ID)
		writeJSON(w, http.StatusCreated, u)
	}
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
		"avoided":            ls.Avoided,
		"false_positives":    ls.FalsePositives,
		"observed_fpr":       ls.ObservedFPR,
		"estimated_fpr":      ls.Guard.EstimatedFPR,
		"bits_per_item":      ls.Guard.BitsPerItem,
		"doublings":          ls.Guard.Doublings,
		"rebuilds":           ls.Rebuilds,
		"pass_through_shard": ls.PassThroughShards,
	}
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
