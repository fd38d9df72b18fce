package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/options"
)

// Filter reports whether a key may exist. A *guarded.Loader implements it
// (and answers true while it is warming up); [GuardFilter] adapts a bare
// [guard.Guard].
//
// The middleware calls MayContain from every request's goroutine at once:
// it must be safe for concurrent use, and fast, since it runs before the
// handler on every request.
type Filter[K comparable] interface {
	MayContain(key K) bool
}

// GuardFilter returns a Filter of string keys backed by g.ContainsString.
// A bare Guard has no warm-up: use it only once it holds every key. It
// panics at once if g is nil, rather than at the first request, as
// [http.Handle] does for a nil handler.
func GuardFilter(g *guard.Guard) Filter[string] {
	if g == nil {
		panic("middleware: GuardFilter: nil guard")
	}
	return guardFilter{g}
}

type guardFilter struct{ g *guard.Guard }

func (f guardFilter) MayContain(key string) bool { return f.g.ContainsString(key) }

// KeyFunc extracts a key from a request and reports whether the request
// has a well-formed one. It must not modify the request.
type KeyFunc[K comparable] func(r *http.Request) (K, bool)

// PathValue extracts the wildcard name of the request's ServeMux pattern
// (Go 1.22 patterns, as in "GET /users/{id}"); an empty value is missing.
func PathValue(name string) KeyFunc[string] {
	return func(r *http.Request) (string, bool) {
		v := r.PathValue(name)
		return v, v != ""
	}
}

// Query extracts the first value of query parameter name; an absent or
// empty parameter is missing.
func Query(name string) KeyFunc[string] {
	return func(r *http.Request) (string, bool) {
		v := r.URL.Query().Get(name)
		return v, v != ""
	}
}

// Header extracts the first value of header name; an absent or empty
// header is missing.
func Header(name string) KeyFunc[string] {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, bool) {
		v := r.Header.Get(name)
		return v, v != ""
	}
}

// Int64 parses the string key of k as a base-10 int64; a key that does not
// parse is malformed.
func Int64(k KeyFunc[string]) KeyFunc[int64] {
	return Parse(k, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
}

// Parse turns the string key of k into the key the guard holds, with
// parse; a key that parse refuses is malformed. The guard compares keys
// exactly (a string by its bytes), so parse must return the form the
// store's keys were added in, the same for every way a client may write
// one key: a UUID in lower case with dashes, an e-mail address of a
// case-insensitive column (citext, or lower-cased on insert) in lower
// case. A key the client writes in another form than the guard's would
// otherwise be rejected, a wrong 404, although the store finds it. A
// guard kept by a follower of the postgres or fanout module holds the
// form its Key method returns for the key column's type (the server's
// own lower() for citext, which strings.ToLower need not match): pass
// that, middleware.Parse(middleware.PathValue("email"), follower.Key).
// Without one:
//
//	uuidKey := middleware.Parse(middleware.PathValue("id"), func(s string) (string, error) {
//		id, err := uuid.Parse(s) // accepts upper case, braces, no dashes
//		return id.String(), err  // the canonical form, as PostgreSQL prints a uuid
//	})
//	emailKey := middleware.Parse(middleware.PathValue("email"), func(s string) (string, error) {
//		return strings.ToLower(s), nil
//	})
func Parse[K comparable](k KeyFunc[string], parse func(string) (K, error)) KeyFunc[K] {
	if k == nil || parse == nil {
		panic("middleware: Parse needs a key function and a parse function")
	}
	return func(r *http.Request) (K, bool) {
		s, ok := k(r)
		if !ok {
			var zero K
			return zero, false
		}
		key, err := parse(s)
		return key, err == nil
	}
}

// Option configures a Middleware made by [New].
type Option func(*config)

type config struct {
	methods []string
	reject  http.Handler
	missing http.Handler
	cookie  *http.Cookie // WithTokenCookie's template
}

// WithMethods sets the request methods that are filtered; requests with
// other methods always pass. The default is GET and HEAD. Methods are
// case-sensitive (RFC 9110): [New] refuses one that is not an HTTP token,
// or that is not upper-case, since "get" never matches a GET request.
func WithMethods(methods ...string) Option {
	return func(c *config) { c.methods = methods }
}

// WithRejectHandler sets the handler that answers requests whose key is
// absent. The default writes 404 Not Found with the problem+json body
// {"type":"about:blank","title":"Not Found","status":404}. Give it the
// function the next handler writes its own 404 with, so that a rejection
// reads the same as a row the handler does not find or will not show
// (another tenant's): see "What a rejection reveals" in the package doc.
func WithRejectHandler(h http.Handler) Option {
	return func(c *config) { c.reject = h }
}

// WithMissingKeyHandler sets the handler for filtered requests without a
// well-formed key. By default they pass to the next handler, which knows
// best what to say about a malformed id.
func WithMissingKeyHandler(h http.Handler) Option {
	return func(c *config) { c.missing = h }
}

// Middleware rejects requests for keys a Filter knows are absent. It is
// safe for concurrent use by multiple goroutines.
type Middleware[K comparable] struct {
	filter  Filter[K]
	cfilter ContextFilter[K] // filter, if it takes a context; nil otherwise
	key     KeyFunc[K]
	methods []string
	reject  http.Handler
	missing http.Handler
	cookie  *http.Cookie

	rejected, passed, missingKey, unfiltered, falsePos *xsync.Counter
	tokens, tokenRefused, tokensSet                    *xsync.Counter
}

// New returns a Middleware that asks f about the key that key extracts.
func New[K comparable](f Filter[K], key KeyFunc[K], opts ...Option) (*Middleware[K], error) {
	if f == nil || key == nil {
		return nil, errors.New("middleware: New needs a filter and a key function")
	}
	c := config{methods: []string{http.MethodGet, http.MethodHead}, reject: http.HandlerFunc(notFound)}
	if err := options.Apply("middleware: New", &c, opts); err != nil {
		return nil, err
	}
	if len(c.methods) == 0 {
		return nil, errors.New("middleware: no methods to filter")
	}
	for _, m := range c.methods {
		if err := checkMethod(m); err != nil {
			return nil, err
		}
	}
	if c.reject == nil {
		return nil, errors.New("middleware: nil reject handler")
	}
	if c.cookie != nil {
		if c.cookie.Name == "" || (&http.Cookie{Name: c.cookie.Name, Value: "x"}).Valid() != nil {
			return nil, fmt.Errorf("middleware: WithTokenCookie: %q is not a cookie name", c.cookie.Name)
		}
	}
	return &Middleware[K]{
		filter: f, cfilter: asContextFilter(f), key: key, methods: c.methods, reject: c.reject, missing: c.missing, cookie: c.cookie,
		rejected: xsync.NewCounter(), passed: xsync.NewCounter(), missingKey: xsync.NewCounter(),
		unfiltered: xsync.NewCounter(), falsePos: xsync.NewCounter(),
		tokens: xsync.NewCounter(), tokenRefused: xsync.NewCounter(), tokensSet: xsync.NewCounter(),
	}, nil
}

// checkMethod returns an error for a method that no request can have, or
// that a request of that name would not have (its lower-case form).
func checkMethod(m string) error {
	if m == "" {
		return errors.New("middleware: WithMethods: an empty method")
	}
	for _, r := range m {
		// RFC 9110's token characters.
		if r > unicode.MaxASCII || !(unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return fmt.Errorf("middleware: WithMethods: %q is not an HTTP method", m)
		}
	}
	if up := strings.ToUpper(m); up != m {
		return fmt.Errorf("middleware: WithMethods: %q is not upper-case: methods are case-sensitive and requests send %q", m, up)
	}
	return nil
}

// Wrap returns next guarded by the middleware. For routers whose
// middleware is a func(http.Handler) http.Handler, pass mw.Wrap itself.
// It panics at once if next is nil, rather than at the first request, as
// [http.Handle] does for a nil handler.
func (m *Middleware[K]) Wrap(next http.Handler) http.Handler {
	if next == nil {
		panic("middleware: Wrap: nil handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(m.methods, r.Method) {
			m.unfiltered.Inc()
			m.serveWrite(w, r, next)
			return
		}
		if text := m.requestToken(r); text != "" {
			r = m.withToken(r, text)
		}
		k, ok := m.key(r)
		if !ok {
			m.missingKey.Inc()
			if m.missing != nil {
				m.missing.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if !m.mayContain(r, k) {
			m.rejected.Inc()
			m.reject.ServeHTTP(w, r)
			return
		}
		m.passed.Inc()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.status == http.StatusNotFound {
			m.falsePos.Inc()
		}
	})
}

// Stats counts what the middleware did. The counters are read one by one.
type Stats struct {
	Rejected       uint64 // answered 404 without the next handler
	Passed         uint64 // the key may exist: passed to the next handler
	MissingKey     uint64 // no well-formed key: passed or sent to the missing-key handler
	Unfiltered     uint64 // method not filtered: passed
	FalsePositives uint64 // passed, and the next handler answered 404
	Tokens         uint64 // filtered requests that carried a consistency token (TokenHeader, WithTokenCookie)
	TokensRefused  uint64 // of those, tokens that did not read: the request passed through, its handler's lookups too
	TokensSet      uint64 // responses of writes that got a token
}

// Stats returns the middleware's counters.
func (m *Middleware[K]) Stats() Stats {
	return Stats{
		Rejected:       uint64(m.rejected.Value()),
		Passed:         uint64(m.passed.Value()),
		MissingKey:     uint64(m.missingKey.Value()),
		Unfiltered:     uint64(m.unfiltered.Value()),
		FalsePositives: uint64(m.falsePos.Value()),
		Tokens:         uint64(m.tokens.Value()),
		TokensRefused:  uint64(m.tokenRefused.Value()),
		TokensSet:      uint64(m.tokensSet.Value()),
	}
}

// problemBody is the RFC 9457 body of the default rejection.
var problemBody = []byte(`{"type":"about:blank","title":"Not Found","status":404}` + "\n")

// Header values shared by every rejection, so that writing them does not
// allocate; nothing appends to them.
var (
	problemType  = []string{"application/problem+json"}
	noSniff      = []string{"nosniff"}
	problemBytes = []string{strconv.Itoa(len(problemBody))}
)

// notFound writes the default rejection: 404 with a problem+json body (no
// body for HEAD).
func notFound(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["Content-Type"] = problemType
	h["X-Content-Type-Options"] = noSniff
	h["Content-Length"] = problemBytes
	w.WriteHeader(http.StatusNotFound)
	if r.Method != http.MethodHead {
		w.Write(problemBody)
	}
}

// statusWriter records the status the next handler writes.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter {
	return w.ResponseWriter
}
