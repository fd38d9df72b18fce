package middleware

import (
	"context"
	"net/http"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// TokenHeader is the header that carries a consistency token
// ([guarded.Token]): the middleware sets it on the response of a write
// whose handler recorded one ([guarded.Wrote], which pgguard's
// Table.Insert and Table.Delete call), and honours it on a request, so
// that a client that sends back the token of its last write reads that
// write on every replica.
const TokenHeader = "Cuckooguard-Token"

// ContextFilter is a [Filter] that honours the consistency token of a
// request's context ([guarded.WithToken]): a *guarded.Loader, whose
// MayContainContext waits, up to its token wait, for its stream to reach
// the token. A Filter that is not one passes every request that carries a
// token.
type ContextFilter[K comparable] interface {
	Filter[K]
	MayContainContext(ctx context.Context, key K) bool
}

// WithTokenCookie makes the middleware carry consistency tokens in a
// cookie as well as in [TokenHeader], for browsers, which do not send a
// header back (the redirect after a POST): c is the cookie's template (a
// Name is needed; Path, Secure, SameSite and the rest as the site needs;
// MaxAge default 60 seconds, as a token is worth something only until
// every replica has its write). A request's header wins over its cookie.
func WithTokenCookie(c http.Cookie) Option {
	return func(cf *config) {
		if c.MaxAge == 0 {
			c.MaxAge = 60
		}
		c.HttpOnly = true
		cf.cookie = &c
	}
}

// requestToken returns r's token text: its TokenHeader, or its cookie.
func (m *Middleware[K]) requestToken(r *http.Request) string {
	if v := r.Header[TokenHeader]; len(v) > 0 { // canonical already: no Get
		return v[0]
	}
	if m.cookie != nil {
		if c, err := r.Cookie(m.cookie.Name); err == nil {
			return c.Value
		}
	}
	return ""
}

// withToken returns r under the token of text, for the filter and the
// handler's own lookups: one that does not read passes them all through.
func (m *Middleware[K]) withToken(r *http.Request, text string) *http.Request {
	m.tokens.Inc()
	tok, err := guarded.ParseToken(text)
	if err != nil {
		m.tokenRefused.Inc()
		return r.WithContext(guarded.WithUnreadableToken(r.Context()))
	}
	return r.WithContext(guarded.WithToken(r.Context(), tok))
}

// mayContain asks the filter about k under r's context, which may carry a
// token.
func (m *Middleware[K]) mayContain(r *http.Request, k K) bool {
	if m.cfilter != nil {
		return m.cfilter.MayContainContext(r.Context(), k)
	}
	if _, ok := guarded.TokenFrom(r.Context()); ok {
		return true // a bare filter cannot wait for a token
	}
	return m.filter.MayContain(k)
}

// serveWrite runs next for a request the middleware does not filter (a
// write), collecting the tokens of its writes ([guarded.Wrote]) and
// setting the latest on the response, before its header is written.
func (m *Middleware[K]) serveWrite(w http.ResponseWriter, r *http.Request, next http.Handler) {
	tw := &tokenWriter{ResponseWriter: w, m: m}
	next.ServeHTTP(tw, r.WithContext(guarded.WithTokenSink(r.Context(), &tw.sink)))
	tw.flushToken()
}

// tokenWriter sets the token a handler's writes recorded on the response,
// when the handler writes the header.
type tokenWriter struct {
	http.ResponseWriter
	m interface {
		setToken(http.Header, guarded.Token)
	}
	sink  guarded.TokenSink
	wrote bool
}

func (w *tokenWriter) flushToken() {
	if !w.wrote {
		w.wrote = true
		if t := w.sink.Token(); !t.IsZero() {
			w.m.setToken(w.Header(), t)
		}
	}
}

func (w *tokenWriter) WriteHeader(code int) {
	w.flushToken()
	w.ResponseWriter.WriteHeader(code)
}

func (w *tokenWriter) Write(p []byte) (int, error) {
	w.flushToken()
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *tokenWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// setToken sets t on a response's header, and its cookie if configured.
func (m *Middleware[K]) setToken(h http.Header, t guarded.Token) {
	m.tokensSet.Inc()
	h.Set(TokenHeader, t.String())
	if m.cookie != nil {
		c := *m.cookie
		c.Value = t.String()
		if v := c.String(); v != "" {
			h.Add("Set-Cookie", v)
		}
	}
}

// asContextFilter returns f as a ContextFilter if it is one, once at New
// rather than per request.
func asContextFilter[K comparable](f Filter[K]) ContextFilter[K] {
	cf, _ := f.(ContextFilter[K])
	return cf
}
