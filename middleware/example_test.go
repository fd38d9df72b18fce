package middleware_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/middleware"
)

func ExampleNew() {
	// A Loader over the users table; here the table is a map.
	rows := map[int64]string{42: "Ada"}
	lookup := func(ctx context.Context, id int64) (string, error) {
		if name, ok := rows[id]; ok {
			return name, nil
		}
		return "", guarded.ErrNotFound
	}
	g, err := guard.New()
	if err != nil {
		panic(err)
	}
	loader, err := guarded.New(g, guarded.GetterFunc[int64, string](lookup))
	if err != nil {
		panic(err)
	}
	defer loader.Close()
	if err := loader.Fill(context.Background(), func(yield func(int64, error) bool) {
		for id := range rows {
			if !yield(id, nil) {
				return
			}
		}
	}); err != nil {
		panic(err)
	}

	// GET /users/{id}: ids the guard has never seen get 404 without
	// reaching the handler (or the database).
	mw, err := middleware.New(loader, middleware.Int64(middleware.PathValue("id")))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("handler called for", r.PathValue("id"))
		io.WriteString(w, "ok\n")
	})))

	for _, path := range []string{"/users/42", "/users/7"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		fmt.Println(path, rec.Code, rec.Header().Get("Content-Type"))
	}
	fmt.Printf("%+v\n", mw.Stats())
	// Output:
	// handler called for 42
	// /users/42 200 text/plain; charset=utf-8
	// /users/7 404 application/problem+json
	// {Rejected:1 Passed:1 MissingKey:0 Unfiltered:0 FalsePositives:0 Tokens:0 TokensRefused:0 TokensSet:0}
}

// ExampleParse: keys in the form the guard holds them, whatever form the
// client writes them in. The guard compares keys exactly; a UUID column
// prints its keys in lower case with dashes, and a case-insensitive
// e-mail column (citext, or lower-cased on insert) in lower case.
func ExampleParse() {
	g, err := guard.New()
	if err != nil {
		panic(err)
	}
	defer g.Close()
	g.AddString("9f077349-bb9c-4c4b-8c1f-1b2b3c4d5e6f") // as the store's keys were read
	g.AddString("ada@example.com")

	uuidKey := middleware.Parse(middleware.PathValue("id"), canonicalUUID)
	emailKey := middleware.Parse(middleware.PathValue("email"), func(s string) (string, error) {
		return strings.ToLower(s), nil
	})
	mux := http.NewServeMux()
	for pattern, key := range map[string]middleware.KeyFunc[string]{"GET /accounts/{id}": uuidKey, "GET /subscribers/{email}": emailKey} {
		mw, err := middleware.New(middleware.GuardFilter(g), key)
		if err != nil {
			panic(err)
		}
		mux.Handle(pattern, mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	}
	for _, path := range []string{
		"/accounts/9F077349-BB9C-4C4B-8C1F-1B2B3C4D5E6F", // upper case
		"/accounts/9f077349bb9c4c4b8c1f1b2b3c4d5e6f",     // no dashes
		"/accounts/00000000-0000-4000-8000-000000000000",
		"/subscribers/Ada@Example.com",
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		fmt.Println(path, rec.Code)
	}
	// Output:
	// /accounts/9F077349-BB9C-4C4B-8C1F-1B2B3C4D5E6F 200
	// /accounts/9f077349bb9c4c4b8c1f1b2b3c4d5e6f 200
	// /accounts/00000000-0000-4000-8000-000000000000 404
	// /subscribers/Ada@Example.com 200
}

// canonicalUUID returns s, a UUID in any case, with or without dashes, in
// lower case with dashes (a package such as github.com/google/uuid does
// the same: uuid.Parse, then String).
func canonicalUUID(s string) (string, error) {
	h := strings.ToLower(strings.ReplaceAll(s, "-", ""))
	if len(h) != 32 || strings.Trim(h, "0123456789abcdef") != "" {
		return "", fmt.Errorf("not a UUID: %q", s)
	}
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}
