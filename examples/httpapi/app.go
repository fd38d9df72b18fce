package main

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

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
	loader, err := guard.NewLoader(g, db.Lookup, guard.WithKeySource(db.IDs), guard.WithLogger(log))
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
	mux.HandleFunc("POST /users", a.createUser)
	mux.HandleFunc("DELETE /users/{id}", a.deleteUser)
	mux.HandleFunc("GET /debug/vars", a.vars)
	a.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return a, nil
}

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
		a.log.ErrorContext(r.Context(), "get user", "id", id, "error", err)
		problem(w, http.StatusInternalServerError, "")
	default:
		writeJSON(w, http.StatusOK, u)
	}
}

// createRequest is the body of POST /users. The id is a string of digits,
// as in {"id": "42", "name": "Ada"}.
type createRequest struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

func (a *app) createUser(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil {
		problem(w, http.StatusBadRequest, "body must be JSON like {\"id\": \"42\", \"name\": \"Ada\"}")
		return
	}
	id, err := strconv.ParseInt(req.ID, 10, 64)
	if err != nil || req.Name == "" {
		problem(w, http.StatusBadRequest, "id must be an integer and name must not be empty")
		return
	}
	u := userdb.User{ID: id, Name: req.Name}
	// The guard gets the id before the row becomes visible (DESIGN §6), so
	// a GET right after this POST never meets a stale "absent".
	err = a.loader.Insert(r.Context(), id, func(ctx context.Context) error { return a.db.Insert(ctx, u) })
	switch {
	case errors.Is(err, userdb.ErrExists):
		problem(w, http.StatusConflict, "a user with this id exists")
	case err != nil:
		a.log.ErrorContext(r.Context(), "create user", "id", id, "error", err)
		problem(w, http.StatusInternalServerError, "")
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
		a.log.ErrorContext(r.Context(), "delete user", "id", id, "error", err)
		problem(w, http.StatusInternalServerError, "")
	case !existed:
		problem(w, http.StatusNotFound, "")
	default:
		w.WriteHeader(http.StatusNoContent)
	}
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
