package middleware

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newGuard(t testing.TB, keys ...string) *guard.Guard {
	t.Helper()
	g, err := guard.New(guard.WithCapacity(1000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	for _, k := range keys {
		if err := g.AddString(k); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// next is a handler that records that it ran and answers 200, or 404 for
// the key "gone".
type next struct{ calls int }

func (n *next) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.calls++
	if r.PathValue("id") == "gone" {
		http.NotFound(w, r)
		return
	}
	io.WriteString(w, "ok")
}

// serve routes one request through a ServeMux with the pattern
// "/users/{id}" guarded by mw.
func serve(mw *Middleware[string], h http.Handler, method, target string, hdr http.Header) *httptest.ResponseRecorder {
	mux := http.NewServeMux()
	mux.Handle("/users/{id}", mw.Wrap(h))
	r := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	return w
}

func TestPathValueRejectsAbsentPassesPresent(t *testing.T) {
	g := newGuard(t, "42", "gone")
	mw, err := New(GuardFilter(g), PathValue("id"))
	if err != nil {
		t.Fatal(err)
	}
	h := &next{}
	tests := []struct {
		name, method, target  string
		wantStatus, wantCalls int
	}{
		{"present", "GET", "/users/42", 200, 1},
		{"absent", "GET", "/users/43", 404, 0},
		{"absent HEAD", "HEAD", "/users/43", 404, 0},
		{"absent POST is not filtered", "POST", "/users/43", 200, 1},
		{"absent DELETE is not filtered", "DELETE", "/users/43", 200, 1},
		{"false positive", "GET", "/users/gone", 404, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h.calls = 0
			w := serve(mw, h, tt.method, tt.target, nil)
			if w.Code != tt.wantStatus || h.calls != tt.wantCalls {
				t.Fatalf("%s %s: status %d, handler calls %d; want %d, %d", tt.method, tt.target, w.Code, h.calls, tt.wantStatus, tt.wantCalls)
			}
		})
	}
	st := mw.Stats()
	if st.Rejected != 2 || st.Passed != 2 || st.Unfiltered != 2 || st.FalsePositives != 1 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestDefaultRejectionIsProblemJSON(t *testing.T) {
	mw, err := New(GuardFilter(newGuard(t)), PathValue("id"))
	if err != nil {
		t.Fatal(err)
	}
	w := serve(mw, &next{}, "GET", "/users/7", nil)
	if w.Code != 404 || w.Header().Get("Content-Type") != "application/problem+json" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("status %d, headers %v", w.Code, w.Header())
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Status != 404 || p.Title != "Not Found" || p.Type != "about:blank" {
		t.Fatalf("body %q: %+v, %v", w.Body.String(), p, err)
	}
	if got := w.Header().Get("Content-Length"); got != strconv.Itoa(w.Body.Len()) {
		t.Fatalf("Content-Length %s for a body of %d bytes", got, w.Body.Len())
	}
	if w := serve(mw, &next{}, "HEAD", "/users/7", nil); w.Body.Len() != 0 {
		t.Fatalf("HEAD rejection has a body")
	}
}

func TestOptions(t *testing.T) {
	g := newGuard(t, "42")
	teapot := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	bad := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadRequest) })
	t.Run("methods", func(t *testing.T) {
		mw, _ := New(GuardFilter(g), PathValue("id"), WithMethods("DELETE"))
		if w := serve(mw, &next{}, "GET", "/users/1", nil); w.Code != 200 {
			t.Fatalf("GET with only DELETE filtered: %d", w.Code)
		}
		if w := serve(mw, &next{}, "DELETE", "/users/1", nil); w.Code != 404 {
			t.Fatalf("DELETE of an absent key: %d", w.Code)
		}
	})
	t.Run("reject handler", func(t *testing.T) {
		mw, _ := New(GuardFilter(g), PathValue("id"), WithRejectHandler(teapot))
		if w := serve(mw, &next{}, "GET", "/users/1", nil); w.Code != http.StatusTeapot {
			t.Fatalf("custom reject: %d", w.Code)
		}
	})
	t.Run("missing key passes by default", func(t *testing.T) {
		mwq, _ := New(GuardFilter(g), Query("id"))
		h := &next{}
		if w := serve(mwq, h, "GET", "/users/x", nil); w.Code != 200 || h.calls != 1 {
			t.Fatalf("request without the query key: %d", w.Code)
		}
		if mwq.Stats().MissingKey != 1 {
			t.Fatalf("Stats = %+v", mwq.Stats())
		}
	})
	t.Run("missing key handler", func(t *testing.T) {
		mw, _ := New(GuardFilter(g), Header("X-User"), WithMissingKeyHandler(bad))
		if w := serve(mw, &next{}, "GET", "/users/x", nil); w.Code != http.StatusBadRequest {
			t.Fatalf("missing header: %d", w.Code)
		}
		if w := serve(mw, &next{}, "GET", "/users/x", http.Header{"X-User": {"42"}}); w.Code != 200 {
			t.Fatalf("present header key: %d", w.Code)
		}
		if w := serve(mw, &next{}, "GET", "/users/x", http.Header{"X-User": {"41"}}); w.Code != 404 {
			t.Fatalf("absent header key: %d", w.Code)
		}
	})
	t.Run("query", func(t *testing.T) {
		mw, _ := New(GuardFilter(g), Query("user"))
		if w := serve(mw, &next{}, "GET", "/users/x?user=42", nil); w.Code != 200 {
			t.Fatalf("present query key: %d", w.Code)
		}
		if w := serve(mw, &next{}, "GET", "/users/x?user=41", nil); w.Code != 404 {
			t.Fatalf("absent query key: %d", w.Code)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		tests := []struct {
			name, want string
			f          Filter[string]
			key        KeyFunc[string]
			opts       []Option
		}{
			{"nil filter", "filter", nil, PathValue("id"), nil},
			{"nil key function", "key function", GuardFilter(g), nil, nil},
			{"nil option", "option 2 of 2 is nil", GuardFilter(g), PathValue("id"), []Option{WithMethods("GET"), nil}},
			{"no methods", "no methods", GuardFilter(g), PathValue("id"), []Option{WithMethods()}},
			{"lower-case method", `"get" is not upper-case`, GuardFilter(g), PathValue("id"), []Option{WithMethods("get")}},
			{"mixed-case method", `"Delete" is not upper-case`, GuardFilter(g), PathValue("id"), []Option{WithMethods("GET", "Delete")}},
			{"empty method", "empty method", GuardFilter(g), PathValue("id"), []Option{WithMethods("")}},
			{"not a token", `"GET /users" is not an HTTP method`, GuardFilter(g), PathValue("id"), []Option{WithMethods("GET /users")}},
			{"nil reject handler", "reject handler", GuardFilter(g), PathValue("id"), []Option{WithRejectHandler(nil)}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				mw, err := New(tt.f, tt.key, tt.opts...)
				if mw != nil || err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("New = %v, %v; want nil and an error that says %q", mw, err, tt.want)
				}
			})
		}
		// Custom methods that are tokens pass.
		if _, err := New(GuardFilter(g), PathValue("id"), WithMethods("PURGE", "M-SEARCH")); err != nil {
			t.Fatalf("custom upper-case methods: %v", err)
		}
	})
	t.Run("nil handler or guard", func(t *testing.T) {
		mw, err := New(GuardFilter(g), PathValue("id"))
		if err != nil {
			t.Fatal(err)
		}
		for name, call := range map[string]func(){
			"Wrap(nil)":        func() { mw.Wrap(nil) },
			"GuardFilter(nil)": func() { GuardFilter(nil) },
		} {
			func() {
				defer func() {
					if r := recover(); r == nil || !strings.HasPrefix(fmt.Sprint(r), "middleware: ") {
						t.Errorf("%s panicked with %v, want at once with a middleware: message", name, r)
					}
				}()
				call()
			}()
		}
	})
}

// TestLoaderWarmUpPassesThrough checks that a Loader that is not ready
// lets every request through, and that rejections show in the
// middleware's stats.
func TestLoaderWarmUpPassesThrough(t *testing.T) {
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, string](func(ctx context.Context, id int64) (string, error) { return "", guarded.ErrNotFound }),
		guarded.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mw, err := New(l, Int64(PathValue("id")))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h := &next{}
	mux.Handle("/users/{id}", mw.Wrap(h))
	get := func(path string) int {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		return w.Code
	}
	if code := get("/users/5"); code != 200 || h.calls != 1 {
		t.Fatalf("warming up: %d, %d calls", code, h.calls)
	}
	l.MarkReady()
	if code := get("/users/5"); code != 404 || h.calls != 1 {
		t.Fatalf("ready, absent id: %d, %d calls", code, h.calls)
	}
	if code := get("/users/abc"); code != 200 {
		t.Fatalf("malformed id: %d, want it passed to the handler", code)
	}
	// The middleware counts what it did; asking the Loader (MayContain)
	// counts nothing there, so that a handler's own Get is not counted twice.
	if st := mw.Stats(); st.Rejected != 1 || st.Passed != 1 || st.MissingKey != 1 {
		t.Fatalf("middleware stats %+v, want 1 rejected, 1 passed, 1 missing key", st)
	}
	if st := l.Stats(); st.Avoided != 0 || st.PassedThrough != 0 {
		t.Fatalf("Loader stats %+v: MayContain counted", st)
	}
}

// nopWriter is a ResponseWriter that allocates nothing.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(int)             {}

func TestRejectPathDoesNotAllocate(t *testing.T) {
	g := newGuard(t)
	mw, err := New(GuardFilter(g), PathValue("id"))
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(&next{})
	r := httptest.NewRequest("GET", "/users/12345", nil)
	r.SetPathValue("id", "12345")
	w := &nopWriter{h: http.Header{}}
	if n := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) }); n != 0 {
		t.Fatalf("the reject path allocates %v times per request", n)
	}
	if mw.Stats().Rejected == 0 {
		t.Fatal("the request was not rejected")
	}
}

func TestDoesNotModifyRequest(t *testing.T) {
	g := newGuard(t, "42")
	mw, _ := New(GuardFilter(g), Query("id"))
	r := httptest.NewRequest("GET", "/x?id=42", nil)
	before := *r.URL
	var seen *http.Request
	mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r2 *http.Request) { seen = r2 })).ServeHTTP(httptest.NewRecorder(), r)
	if seen != r || *r.URL != before {
		t.Fatalf("the middleware replaced or changed the request")
	}
}

// FuzzKeyExtraction builds requests from arbitrary path segments, query
// strings and header values: extraction never panics, and a request whose
// extracted key was added is never rejected.
func FuzzKeyExtraction(f *testing.F) {
	f.Add("42", "id=42", "42")
	f.Add("%zz", "id=%zz&id=1", "\x00")
	f.Add("", ";;&&==", "")
	f.Add("ünï/cødé", "id=a+b&x", "  spaced  ")
	f.Fuzz(func(t *testing.T, seg, rawQuery, hdr string) {
		g, err := guard.New(guard.WithCapacity(100))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		r := &http.Request{
			Method: "GET",
			URL:    &url.URL{Path: "/users/" + seg, RawQuery: rawQuery},
			Header: http.Header{"X-Key": {hdr}},
		}
		r.SetPathValue("id", seg)
		for _, kf := range []KeyFunc[string]{PathValue("id"), Query("id"), Header("X-Key")} {
			k, ok := kf(r)
			if !ok {
				continue
			}
			if err := g.AddString(k); err != nil {
				t.Fatal(err)
			}
			mw, err := New(GuardFilter(g), kf)
			if err != nil {
				t.Fatal(err)
			}
			called := false
			mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true })).ServeHTTP(&nopWriter{h: http.Header{}}, r)
			if !called {
				t.Fatalf("request for present key %q was rejected", k)
			}
		}
		if _, ok := Int64(Query("id"))(r); ok {
			if _, err := strconv.ParseInt(r.URL.Query().Get("id"), 10, 64); err != nil {
				t.Fatalf("Int64 accepted a malformed key")
			}
		}
	})
}
