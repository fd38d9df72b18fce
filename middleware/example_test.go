package middleware_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

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
	// {Rejected:1 Passed:1 MissingKey:0 Unfiltered:0 FalsePositives:0}
}
