package middleware

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"testing"
)

// TestRejectionRevealsNothing is the HTTP side of issue 49's leak: a
// tenant, authenticated before the middleware, asks for another tenant's
// row, which the handler hides with its own 404, and for an id that does
// not exist, which the guard rejects. With WithRejectHandler set to the
// handler's own 404 the two responses are the same bytes (the Date
// header aside); with the default rejection they differ. An
// unauthenticated caller gets 401 for both: the guard sits behind
// authentication.
func TestRejectionRevealsNothing(t *testing.T) {
	// Tenant "a" owns ids 1-9, tenant "b" ids 10-19; the guard holds them all.
	g := newGuard(t, "1", "2", "10", "11")
	owner := map[string]string{"1": "a", "2": "a", "10": "b", "11": "b"}
	notFound := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":"user not found"}`))
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if owner[id] != r.Header.Get("X-Tenant") { // absent, or another tenant's
			notFound(w, r)
			return
		}
		w.Write([]byte(`{"id":"` + id + `"}`))
	})
	auth := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Tenant") == "" {
				http.Error(w, "who are you?", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	for _, identical := range []bool{true, false} {
		t.Run(fmt.Sprintf("reject=%s", map[bool]string{true: "handler's", false: "default"}[identical]), func(t *testing.T) {
			var opts []Option
			if identical {
				opts = append(opts, WithRejectHandler(http.HandlerFunc(notFound)))
			}
			mw, err := New(GuardFilter(g), PathValue("id"), opts...)
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.Handle("GET /users/{id}", auth(mw.Wrap(handler)))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			get := func(id, tenant string) []byte {
				t.Helper()
				req, err := http.NewRequest(http.MethodGet, srv.URL+"/users/"+id, nil)
				if err != nil {
					t.Fatal(err)
				}
				if tenant != "" {
					req.Header.Set("X-Tenant", tenant)
				}
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				resp.Header.Del("Date")
				b, err := httputil.DumpResponse(resp, true)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			hidden, absent := get("10", "a"), get("12345", "a")
			if st := mw.Stats(); st.Rejected != 1 {
				t.Fatalf("rejected %d, want 1: the absent id", st.Rejected)
			}
			switch same := bytes.Equal(hidden, absent); {
			case identical && !same:
				t.Errorf("another tenant's row and an absent id are told apart:\nhidden:\n%s\nabsent:\n%s", hidden, absent)
			case !identical && same:
				t.Errorf("the default rejection reads as the handler's 404:\n%s", absent)
			}
			if a, b := get("10", ""), get("12345", ""); !bytes.Equal(a, b) {
				t.Errorf("unauthenticated, an existing id and an absent one are told apart:\n%s\n%s", a, b)
			}
		})
	}
}
