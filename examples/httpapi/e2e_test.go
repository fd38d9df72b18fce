package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cuckooguard/cuckooguard/examples/internal/pgtest"
	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/internal/tcpproxy"
	"github.com/cuckooguard/cuckooguard/postgres"
	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) {
		if buildDir != "" {
			os.RemoveAll(buildDir) // the binary TestReplicasBlackBox built: 29 MB
		}
	}))
}

// startApp serves a fresh app over loopback and returns its base URL.
func startApp(t *testing.T, rows int64) (*app, string) {
	t.Helper()
	ctx := context.Background()
	a, err := newApp(ctx, config{DSN: filepath.Join(t.TempDir(), "users.db"), Rows: rows}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.serve(ln) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.shutdown(sctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return a, "http://" + ln.Addr().String()
}

type client struct {
	t    *testing.T
	base string
	c    *http.Client
}

func (c client) do(method, path string, body any) (int, []byte) {
	code, _, b := c.doHeader(method, path, body)
	return code, b
}

func (c client) doHeader(method, path string, body any) (int, http.Header, []byte) {
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, r)
	if err != nil {
		c.t.Error(err)
		return 0, nil, nil
	}
	resp, err := c.c.Do(req)
	if err != nil {
		c.t.Error(err)
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func TestEndToEnd(t *testing.T) {
	const rows = 2000
	a, base := startApp(t, rows)
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	defer tr.CloseIdleConnections()
	c := client{t: t, base: base, c: &http.Client{Transport: tr, Timeout: 30 * time.Second}}

	// Before the warm-up every lookup reaches the database.
	if code, _ := c.do("GET", "/users/999999", nil); code != 404 {
		t.Fatalf("GET unknown before warm-up = %d", code)
	}
	if a.db.Lookups.Load() != 1 {
		t.Fatalf("%d queries for one unknown id before warm-up, want 1", a.db.Lookups.Load())
	}
	if err := a.warmUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, b := c.do("GET", "/users/7", nil); code != 200 || !bytes.Contains(b, []byte(`"name":"user 7"`)) {
		t.Fatalf("GET /users/7 = %d %s", code, b)
	}

	// Create, read, delete and read unknown ids from several goroutines.
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range 40 {
				id := 1_000_000 + w*1000 + i
				path := fmt.Sprintf("/users/%d", id)
				if code, b := c.do("POST", "/users", map[string]string{"id": fmt.Sprint(id), "name": "n"}); code != 201 {
					t.Errorf("POST %d = %d %s", id, code, b)
					return
				}
				if code, _ := c.do("GET", path, nil); code != 200 {
					t.Errorf("GET %s right after POST = %d, want 200", path, code)
					return
				}
				if r.IntN(2) == 0 {
					if code, _ := c.do("DELETE", path, nil); code != 204 {
						t.Errorf("DELETE %s = %d", path, code)
					}
					if code, _ := c.do("GET", path, nil); code != 404 {
						t.Errorf("GET %s after DELETE = %d, want 404", path, code)
					}
					if code, _ := c.do("DELETE", path, nil); code != 404 {
						t.Errorf("second DELETE %s = %d, want 404", path, code)
					}
				}
			}
		})
	}
	wg.Wait()

	// Unknown ids cost no query, except the guard's rare false positives.
	before, fpBefore := a.db.Lookups.Load(), a.loader.Stats().FalsePositives
	const unknown = 5000
	for w := range 5 {
		wg.Go(func() {
			for i := range unknown / 5 {
				if code, _ := c.do("GET", fmt.Sprintf("/users/%d", 50_000_000+w*unknown+i), nil); code != 404 {
					t.Errorf("GET unknown = %d", code)
					return
				}
			}
		})
	}
	wg.Wait()
	queries := a.db.Lookups.Load() - before
	fps := a.loader.Stats().FalsePositives - fpBefore
	t.Logf("%d unknown ids: %d database queries, %d false positives", unknown, queries, fps)
	if queries != int64(fps) || fps > unknown/100 {
		t.Fatalf("%d queries for %d unknown ids with %d false positives", queries, unknown, fps)
	}

	// Bad input and the expvar object.
	if code, _ := c.do("GET", "/users/abc", nil); code != 400 {
		t.Fatalf("GET /users/abc = %d, want 400", code)
	}
	if code, _ := c.do("POST", "/users", map[string]string{"id": "7", "name": "dup"}); code != 409 {
		t.Fatalf("POST of an existing id = %d, want 409", code)
	}
	code, b := c.do("GET", "/debug/vars", nil)
	var vars struct {
		G map[string]any `json:"cuckooguard"`
	}
	if err := json.Unmarshal(b, &vars); code != 200 || err != nil {
		t.Fatalf("GET /debug/vars = %d, %v", code, err)
	}
	for _, k := range []string{"rejected", "store_calls", "false_positives", "items", "ready"} {
		if _, ok := vars.G[k]; !ok {
			t.Errorf("/debug/vars cuckooguard has no %q: %v", k, vars.G)
		}
	}
	if vars.G["ready"] != true || vars.G["rejected"].(float64) < unknown-float64(fps) {
		t.Errorf("/debug/vars cuckooguard = %v", vars.G)
	}
	// One name, one count: /debug/vars' "avoided" is /metrics' avoided
	// lookups (the first week in production found them apart).
	_, m := c.do("GET", "/metrics", nil)
	re := regexp.MustCompile(`(?m)^cuckooguard_loader_lookups_total\{result="avoided"\} (\S+)$`)
	got := re.FindSubmatch(m)
	if got == nil {
		t.Fatalf("/metrics has no avoided lookups:\n%s", m)
	}
	if want := strconv.FormatFloat(vars.G["avoided"].(float64), 'g', -1, 64); string(got[1]) != want {
		t.Errorf("/metrics avoided = %s, /debug/vars avoided = %s", got[1], want)
	}
}

// TestRoundTrip is part of the first-hour issue: GET answered the id as a
// JSON number but POST wanted a string, so a JSON client that sent back a
// user it had read got 400. POST takes what GET answers, ids beyond 2^53
// keep every digit, and the string form still works.
func TestRoundTrip(t *testing.T) {
	_, base := startApp(t, 10)
	c := client{t: t, base: base, c: &http.Client{Timeout: 10 * time.Second}}
	code, b := c.do("GET", "/users/7", nil)
	if code != 200 {
		t.Fatalf("GET /users/7 = %d %s", code, b)
	}
	var u map[string]any
	if err := json.Unmarshal(b, &u); err != nil {
		t.Fatal(err)
	}
	for _, id := range []json.Number{"1001", "9007199254740993"} { // 2^53 + 1
		u["id"] = id
		body, _ := json.Marshal(u)
		req, _ := http.NewRequest("POST", base+"/users", bytes.NewReader(body))
		resp, err := c.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 || resp.Header.Get("Location") != "/users/"+id.String() {
			t.Fatalf("POST %s = %d (Location %q), want 201", body, resp.StatusCode, resp.Header.Get("Location"))
		}
		if code, got := c.do("GET", "/users/"+id.String(), nil); code != 200 || !bytes.Contains(got, []byte(`"id":`+id.String()+`,`)) {
			t.Fatalf("GET of the user sent back = %d %s", code, got)
		}
	}
	if code, b := c.do("POST", "/users", map[string]string{"id": "1002", "name": "as a string"}); code != 201 {
		t.Fatalf("POST with the id as a string = %d %s", code, b)
	}
}

// TestBadRequests checks the answers to what a client gets wrong: every
// error is problem+json, including the router's own 404 and 405.
func TestBadRequests(t *testing.T) {
	_, base := startApp(t, 10)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	tests := []struct {
		name, method, path, body string
		want                     int
	}{
		{"oversized body", "POST", "/users", `{"id": "1", "name": "` + strings.Repeat("a", 70_000) + `"}`, 413},
		{"trailing JSON", "POST", "/users", `{"id": "11", "name": "a"} {"id": "12"}`, 400},
		{"trailing garbage", "POST", "/users", `{"id": "11", "name": "a"}x`, 400},
		{"invalid UTF-8", "POST", "/users", "{\"id\": \"11\", \"name\": \"a\xff\xfe\"}", 400},
		{"NUL in name", "POST", "/users", `{"id": "11", "name": "a\u0000b"}`, 400},
		{"unknown field", "POST", "/users", `{"id": "11", "name": "a", "email": "a@example.com"}`, 400},
		{"misspelt field", "POST", "/users", `{"id": "11", "nmae": "a"}`, 400},
		{"fractional id", "POST", "/users", `{"id": 11.5, "name": "a"}`, 400},
		{"exponent id", "POST", "/users", `{"id": 1e3, "name": "a"}`, 400},
		{"id out of range", "POST", "/users", `{"id": 9223372036854775808, "name": "a"}`, 400},
		{"id as a word", "POST", "/users", `{"id": "eleven", "name": "a"}`, 400},
		{"id as a bool", "POST", "/users", `{"id": true, "name": "a"}`, 400},
		{"not JSON", "POST", "/users", `id=11`, 400},
		{"bad id", "GET", "/users/x1", "", 400},
		{"no route", "GET", "/nothing/here", "", 404},
		{"wrong method", "PUT", "/users/1", "", 405},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, base+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var p struct {
				Status int    `json:"status"`
				Title  string `json:"title"`
			}
			err = json.NewDecoder(resp.Body).Decode(&p)
			if resp.StatusCode != tt.want || err != nil || p.Status != tt.want ||
				resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%s %s = %d %s (%+v, %v), want %d problem+json", tt.method, tt.path, resp.StatusCode, resp.Header.Get("Content-Type"), p, err, tt.want)
			}
			if tt.want == 405 && resp.Header.Get("Allow") == "" {
				t.Errorf("405 without an Allow header")
			}
		})
	}
	// None of the bad POSTs created a user.
	if code, _ := (client{t: t, base: base, c: hc}).do("GET", "/users/11", nil); code != 404 {
		t.Fatalf("GET /users/11 = %d after rejected POSTs, want 404", code)
	}
}

// replicas numbers the replicas of startReplica: each has an origin of
// its own.
var replicas atomic.Int64

// startReplica serves an app on PostgreSQL (dsn) in process, with its
// follower running, and waits until it is ready.
func startReplica(t *testing.T, dsn string, rows int64) (*app, string) {
	t.Helper()
	ctx := context.Background()
	origin := fmt.Sprintf("test-%s-%d", t.Name(), replicas.Add(1))
	a, err := newApp(ctx, config{DSN: dsn, Rows: rows, Origin: origin, Heartbeat: 100 * time.Millisecond}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	warmErr := make(chan error, 1)
	go func() { warmErr <- a.warmUp(wctx) }()
	srv := httptest.NewServer(a.srv.Handler)
	t.Cleanup(func() {
		srv.Close()
		stop()
		if err := <-warmErr; err != nil {
			t.Errorf("follower: %v", err)
		}
		a.shutdown(context.Background())
	})
	waitReady(t, a, true, 10*time.Second)
	return a, srv.URL
}

// waitReady waits until the app's Loader is ready (or not ready).
func waitReady(t *testing.T, a *app, ready bool, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for a.loader.Ready() != ready {
		if time.Since(start) > limit {
			t.Fatalf("Loader ready %v for %v; follower %+v", !ready, limit, a.follower.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// TestDatabaseDown runs the service on PostgreSQL through a proxy and
// takes the database away: lookups and writes get 503 with Retry-After,
// not 500, and the service recovers when the database is back. Ids the
// guard knows are absent get 404 until the follower notices the outage;
// after that the guard cannot know what other replicas created, so their
// lookups go to the database too (503), never a guess.
func TestDatabaseDown(t *testing.T) {
	u, err := url.Parse(pgtest.Schema(t, pgtest.DSN(t)))
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	p, err := tcpproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	u.Host = p.Addr()
	a, base := startReplica(t, u.String(), 100)
	c := client{t: t, base: base, c: &http.Client{Timeout: 30 * time.Second}}
	if code, _ := c.do("GET", "/users/5", nil); code != 200 {
		t.Fatalf("GET /users/5 = %d", code)
	}
	if code, _ := c.do("GET", "/users/99999999", nil); code != 404 || a.db.Lookups.Load() != 1 {
		t.Fatalf("GET unknown id = %d after %d queries, want 404 from the guard", code, a.db.Lookups.Load())
	}
	// The database goes away: open connections break, new ones are
	// refused.
	p.SetTarget("127.0.0.1:1")
	p.CloseConns()
	for _, req := range []struct{ method, path string }{{"GET", "/users/5"}, {"POST", "/users"}, {"DELETE", "/users/6"}} {
		var body any
		if req.method == "POST" {
			body = map[string]string{"id": "1000", "name": "x"}
		}
		code, h, b := c.doHeader(req.method, req.path, body)
		if code != 503 || h.Get("Retry-After") == "" {
			t.Fatalf("%s %s with the database down = %d %s (Retry-After %q), want 503 with Retry-After", req.method, req.path, code, b, h.Get("Retry-After"))
		}
	}
	t.Logf("follower noticed the outage after %v", waitReady(t, a, false, 5*time.Second))
	if code, b := c.do("GET", "/users/99999999", nil); code != 503 {
		t.Fatalf("GET unknown id with the database down and the follower disconnected = %d %s, want 503", code, b)
	}
	if code, _ := c.do("GET", "/readyz", nil); code != 503 {
		t.Fatalf("/readyz with the follower disconnected = %d, want 503", code)
	}
	p.SetTarget(target) // back
	t.Logf("following again %v after the database came back", waitReady(t, a, true, 10*time.Second))
	if code, b := c.do("GET", "/users/5", nil); code != 200 {
		t.Fatalf("GET /users/5 = %d %s after the database came back", code, b)
	}
	if code, _ := c.do("GET", "/users/99999999", nil); code != 404 {
		t.Fatalf("GET unknown id after the database came back = %d, want 404", code)
	}
	if code, _ := c.do("GET", "/readyz", nil); code != 200 {
		t.Fatalf("/readyz after recovery = %d, want 200", code)
	}
}

// TestGetUsersBatch asks for many ids in one request: the users that exist
// come back in order, the others are listed as missing, and the database
// sees one query.
func TestGetUsersBatch(t *testing.T) {
	a, base := startApp(t, 100)
	if err := a.warmUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := client{t: t, base: base, c: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
	var ids []string
	for i := range 200 {
		ids = append(ids, strconv.Itoa(i+1)) // 1..100 exist, 101..200 do not
	}
	lookups, batches := a.db.Lookups.Load(), a.db.BatchLookups.Load()
	code, b := c.do("GET", "/users?ids="+strings.Join(ids, ","), nil)
	var resp usersResponse
	if err := json.Unmarshal(b, &resp); code != 200 || err != nil {
		t.Fatalf("GET /users?ids=… = %d %s (%v)", code, b, err)
	}
	if len(resp.Users) != 100 || len(resp.Missing) != 100 || resp.Users[0].ID != 1 || resp.Missing[0] != 101 {
		t.Fatalf("%d users and %d missing: %+v", len(resp.Users), len(resp.Missing), resp)
	}
	if n, m := a.db.BatchLookups.Load()-batches, a.db.Lookups.Load()-lookups; n != 1 || m != 0 {
		t.Fatalf("one request for 200 ids ran %d batch and %d single queries, want 1 and 0", n, m)
	}
	for _, q := range []string{"", "1,x", strings.Repeat("1,", maxBatch) + "1"} {
		if code, _ := c.do("GET", "/users?ids="+q, nil); code != 400 {
			t.Errorf("GET /users?ids=%.20q = %d, want 400", q, code)
		}
	}
}

// TestNoOriginLeavesNoSlot is the first week's slot leak: a replica run
// without -origin made a permanent slot of a random name on every run,
// which held WAL on the server for good. Without an origin the follower's
// slot is temporary: nothing is left once the process is gone.
func TestNoOriginLeavesNoSlot(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Schema(t, pgtest.DSN(t))
	if o := replicaOrigin("", false); o != "" {
		t.Fatalf("replicaOrigin without -origin or -snapshot = %q, want none", o)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for run := range 2 {
		a, err := newApp(ctx, config{DSN: dsn, Rows: 100, Heartbeat: 100 * time.Millisecond}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		wctx, stop := context.WithCancel(ctx)
		warmErr := make(chan error, 1)
		go func() { warmErr <- a.warmUp(wctx) }()
		waitReady(t, a, true, 10*time.Second)
		stop()
		<-warmErr
		a.shutdown(ctx)
		slots, err := postgres.Slots(ctx, conn, "users")
		if err != nil {
			t.Fatal(err)
		}
		if len(slots) != 0 {
			t.Fatalf("after run %d without an origin: permanent slots %+v", run+1, slots)
		}
	}
}

// TestGeneratedIDs is the first week's generated-key finding: a POST
// without an id gets one from the database (an identity column on
// PostgreSQL, the rowid on SQLite), through guarded's InsertGenerated;
// the new row is found at once on the replica that created it and, once
// its follower applied it, on another; the writing replica's follower
// skips exactly that insert.
func TestGeneratedIDs(t *testing.T) {
	post := func(t *testing.T, base string) int64 {
		t.Helper()
		code, b := (client{t: t, base: base, c: http.DefaultClient}).do("POST", "/users", map[string]string{"name": "Grace"})
		var u userdb.User
		if err := json.Unmarshal(b, &u); code != 201 || err != nil || u.ID == 0 || u.Name != "Grace" {
			t.Fatalf("POST without an id = %d %s (%v)", code, b, err)
		}
		return u.ID
	}
	t.Run("sqlite", func(t *testing.T) {
		_, base := startApp(t, 100)
		id := post(t, base)
		if id != 101 {
			t.Fatalf("generated id %d, want 101 (one past the seeded rows)", id)
		}
		if code, _ := (client{t: t, base: base, c: http.DefaultClient}).do("GET", fmt.Sprintf("/users/%d", id), nil); code != 200 {
			t.Fatalf("GET of the generated id = %d", code)
		}
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.Schema(t, pgtest.DSN(t))
		a, baseA := startReplica(t, dsn, 100)
		_, baseB := startReplica(t, dsn, 100)
		for range 5 {
			id := post(t, baseA)
			if code, _ := (client{t: t, base: baseA, c: http.DefaultClient}).do("GET", fmt.Sprintf("/users/%d", id), nil); code != 200 {
				t.Fatalf("GET on the creating replica = %d", code)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				code, _ := (client{t: t, base: baseB, c: http.DefaultClient}).do("GET", fmt.Sprintf("/users/%d", id), nil)
				if code == 200 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("GET of generated id %d on the other replica = %d after 5 s", id, code)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		// The other replica reading a row says nothing of when this
		// replica's follower gets to it: wait for it, as long as for B.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			st := a.follower.Stats()
			if st.Skipped == 5 {
				break
			}
			if st.Skipped > 5 || time.Now().After(deadline) {
				t.Fatalf("the creating replica's follower skipped %d inserts, want its 5", st.Skipped)
			}
		}
	})
}
