// Package middleware provides net/http middleware that answers 404 Not
// Found for requests whose key a guard knows is absent, before the handler
// (and its database query) runs.
//
// The middleware takes the key from the request (a path wildcard, a query
// parameter, a header, or a function of yours), asks a [Filter] (a
// *guarded.Loader, or a *guard.Guard through [GuardFilter]) whether the key
// may exist, and if not, responds with 404 and an RFC 9457
// application/problem+json body without calling the next handler. Every
// other request reaches the next handler unchanged: requests with methods
// that are not filtered (by default all but GET and HEAD), requests without
// a well-formed key, and every request while the Loader is still warming
// up. The middleware never modifies the request, and it looks nothing up
// in the store.
//
// The middleware filters requests for one key. A request for many keys
// (GET /users?ids=1,2,3) is the handler's to guard: it asks the Loader's
// GetMany, which answers the keys the guard knows are absent without the
// store and looks the others up in one call of the store's batch lookup
// (guarded.BatchGetter); examples/httpapi shows it.
//
// A request that passes and still gets a 404 from the next handler is
// counted as an observed false positive. To see the status the middleware
// wraps the ResponseWriter of passed requests; the wrapper supports
// [http.ResponseController] (it has Unwrap) but not direct type
// assertions to http.Flusher or http.Hijacker.
//
// The middleware counts what it does ([Middleware.Stats]); asking a Loader
// whether a key may exist changes none of the Loader's counters, so the
// handler's own Get is counted once.
//
// # What a rejection reveals
//
// A rejection tells a client that no row has the key, and no more than
// the next handler's own 404 would if:
//
//   - it reads the same: the default body is the middleware's own, so set
//     [WithRejectHandler] to what the handler writes for a row it does not
//     find or will not show (another tenant's), byte for byte;
//   - it comes after authentication and authorization: wrap the handler
//     that already knows who asks (mux.Handle("GET /users/{id}",
//     auth(mw.Wrap(getUser)))), or an unauthenticated caller tells 404
//     (absent) from 401 (exists);
//   - its speed tells nothing: the guard answers in microseconds, the
//     handler after a store round trip. Key the guard by what the caller
//     may see (a multi-tenant table by tenant and id), so that another
//     tenant's row is absent to the guard as well, or delay rejections to
//     the handler's usual time in a reject handler of your own.
//
// Usage:
//
//	users, err := guarded.New(g, guarded.GetterFunc[int64, User](db.LookupUser))
//	if err != nil {
//		return err
//	}
//	mw, err := middleware.New(users, middleware.Int64(middleware.PathValue("id")))
//	if err != nil {
//		return err
//	}
//	mux.Handle("GET /users/{id}", mw.Wrap(http.HandlerFunc(getUser)))
package middleware
