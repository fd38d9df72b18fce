// Package middleware provides net/http middleware that answers 404 Not
// Found for requests whose key a guard knows is absent, before the handler
// (and its database query) runs.
//
// The middleware takes the key from the request (a path wildcard, a query
// parameter, a header, or a function of yours), asks a [Filter] (a
// *guard.Loader, or a *guard.Guard through [GuardFilter]) whether the key
// may exist, and if not, responds with 404 and an RFC 9457
// application/problem+json body without calling the next handler. Every
// other request reaches the next handler unchanged: requests with methods
// that are not filtered (by default all but GET and HEAD), requests without
// a well-formed key, and every request while the Loader is still warming
// up. The middleware never modifies the request, and it looks nothing up
// in the store.
//
// The middleware filters requests for one key. A request for many keys
// (GET /users?ids=1,2,3) is the handler's to guard: it asks
// [guard.Loader.GetMany], which answers the keys the guard knows are absent
// without the store and looks the others up in one call of the batch
// lookup ([guard.WithBatchLookup]); examples/httpapi shows it.
//
// A request that passes and still gets a 404 from the next handler is
// counted as an observed false positive. To see the status the middleware
// wraps the ResponseWriter of passed requests; the wrapper supports
// [http.ResponseController] (it has Unwrap) but not direct type
// assertions to http.Flusher or http.Hijacker.
//
// Usage:
//
//	loader, err := guard.NewLoader(g, db.LookupUser)
//	if err != nil { ... }
//	mw, err := middleware.New(loader, middleware.Int64(middleware.PathValue("id")))
//	if err != nil { ... }
//	mux.Handle("GET /users/{id}", mw.Wrap(http.HandlerFunc(getUser)))
package middleware
