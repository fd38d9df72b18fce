package middleware

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// tokenService is a replica's table: a Loader over a map, ready, with its
// feed at position 10 of stream "db", behind the middleware, with
// POST /items/{id} writing a row and recording the write's token, and
// GET /items/{id} reading it through the Loader.
type tokenService struct {
	mu     sync.Mutex
	rows   map[int64]bool
	loader *guarded.Loader[int64, string]
	feed   *guarded.Feed[int64]
	mw     *Middleware[int64]
	h      http.Handler
}

func newTokenService(t *testing.T, opts ...Option) *tokenService {
	t.Helper()
	s := &tokenService{rows: map[int64]bool{1: true}}
	g, err := guard.New(guard.WithCapacity(1000))
	if err != nil {
		t.Fatal(err)
	}
	s.loader, err = guarded.New(g, guarded.GetterFunc[int64, string](func(ctx context.Context, k int64) (string, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.rows[k] {
			return "row", nil
		}
		return "", guarded.ErrNotFound
	}), guarded.WithTokenWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.loader.Close() })
	if s.feed, err = s.loader.AttachFeed(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.feed.Detach)
	if err := s.feed.Resync(context.Background(), func(ctx context.Context, add func(int64) error) error { return add(1) }); err != nil {
		t.Fatal(err)
	}
	s.reach(10)
	s.feed.MarkReady()
	if s.mw, err = New(s.loader, Int64(PathValue("id")), opts...); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", s.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if _, err := s.loader.Get(r.Context(), id); errors.Is(err, guarded.ErrNotFound) {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("found"))
	})))
	mux.Handle("POST /items/{id}", s.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
		s.mu.Lock()
		s.rows[id] = true // committed on another replica: this one's stream has not applied it
		s.mu.Unlock()
		tok, _ := guarded.NewToken("db", 20)
		guarded.Wrote(r.Context(), tok)
		w.WriteHeader(http.StatusCreated)
	})))
	s.h = mux
	return s
}

func (s *tokenService) reach(pos uint64) {
	tok, _ := guarded.NewToken("db", pos)
	s.feed.Reached(tok)
}

func (s *tokenService) do(method, path string, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, req)
	return rec
}

// TestMiddlewareTokenRoundTrip: a write's response carries its token
// (header and cookie); a read that sends it back waits for the replica's
// stream and finds the row, where the same read without it gets the
// guard's 404. A token that does not read passes the request, and the
// handler's own lookup, through to the store.
func TestMiddlewareTokenRoundTrip(t *testing.T) {
	s := newTokenService(t, WithTokenCookie(http.Cookie{Name: "cg", Path: "/"}))
	w := s.do("POST", "/items/7", nil)
	tok := w.Header().Get(TokenHeader)
	if tok != "db.14" {
		t.Fatalf("the write's response has token %q, want db.14", tok)
	}
	if c := w.Header().Get("Set-Cookie"); !strings.HasPrefix(c, "cg=db.14;") || !strings.Contains(c, "HttpOnly") || !strings.Contains(c, "Max-Age=60") {
		t.Fatalf("the write's cookie: %q", c)
	}
	if code := s.do("GET", "/items/7", nil).Code; code != http.StatusNotFound {
		t.Fatalf("without the token: %d; the test proves nothing unless the guard says 404", code)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		s.feed.Apply(guarded.Change[int64]{Key: 7})
		s.reach(20)
	}()
	if w := s.do("GET", "/items/7", http.Header{TokenHeader: {tok}}); w.Code != http.StatusOK {
		t.Fatalf("with the token in the header: %d", w.Code)
	}
	// By cookie, for a row the stream has not applied: the middleware
	// waits a second, then passes through, and the handler's Get too.
	s.mu.Lock()
	s.rows[8] = true
	s.mu.Unlock()
	if w := s.do("GET", "/items/8", http.Header{"Cookie": {"cg=db.15"}}); w.Code != http.StatusOK {
		t.Fatalf("with the token in a cookie: %d", w.Code)
	}
	s.mu.Lock()
	s.rows[9] = true
	s.mu.Unlock()
	if w := s.do("GET", "/items/9", http.Header{TokenHeader: {"not a token"}}); w.Code != http.StatusOK {
		t.Fatalf("with a token that does not read: %d, want the store's answer", w.Code)
	}
	if w := s.do("GET", "/items/404404", http.Header{TokenHeader: {tok}}); w.Code != http.StatusNotFound {
		t.Fatalf("an absent row under a reached token: %d", w.Code)
	}
	st := s.mw.Stats()
	if st.Tokens != 4 || st.TokensRefused != 1 || st.TokensSet != 1 || st.Rejected != 2 || st.MissingKey != 0 {
		t.Fatalf("stats %+v", st)
	}
	if ls := s.loader.Stats(); ls.TokenForeign != 2 { // the filter's and the handler's lookups under the unreadable token
		t.Fatalf("loader stats %+v", ls)
	}
}

func TestTokenCookieName(t *testing.T) {
	for _, name := range []string{"", "a b", "a;b"} {
		if _, err := New(GuardFilter(mustGuardT(t)), PathValue("id"), WithTokenCookie(http.Cookie{Name: name})); err == nil {
			t.Errorf("cookie name %q taken", name)
		}
	}
}

func mustGuardT(t *testing.T) *guard.Guard {
	g, err := guard.New(guard.WithCapacity(10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}
