package pgguard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/middleware"
	"github.com/cuckooguard/cuckooguard/postgres"
)

// serve puts r behind an HTTP server as a service would: GET /orders/{id}
// behind the table's middleware (404 from the guard or the store), POST
// /orders creating an order through Table.InsertGenerated, whose token
// the middleware sets on the response.
func (r *replica) serve(t *testing.T) *httptest.Server {
	t.Helper()
	mw, err := r.orders.Middleware(middleware.PathValue("id"))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /orders/{id}", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id, _ := r.orders.Key(req.PathValue("id"))
		if _, err := r.orders.Loader().Get(req.Context(), id); NotFound(err) {
			http.NotFound(w, req)
		} else if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})))
	mux.Handle("POST /orders", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var id int64
		_, err := r.orders.InsertGenerated(req.Context(), func(ctx context.Context, tx pgx.Tx, add func(int64) error) error {
			if err := tx.QueryRow(ctx, `INSERT INTO orders (customer) VALUES ('token') RETURNING id`).Scan(&id); err != nil {
				return err
			}
			return add(id)
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		json.NewEncoder(w).Encode(id)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestReadYourWritesAcrossReplicas: clients create orders through replica
// A's HTTP server and at once, with no sleep, read each through B's and
// C's with the token A's response carried: 0 404s, in steady state, while
// the relay's holder stops and another takes over, during a 1M-row load
// into a table no replica follows, and across a broker restart (where
// CUCKOOGUARD_NATS_RESTART is set). Each read is counted that B's guard
// alone would have answered 404, and the latencies of reads with a token
// and of reads of old rows without one are reported.
func TestReadYourWritesAcrossReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("a long integration test")
	}
	n := 10_000
	if s := os.Getenv("CUCKOOGUARD_TOKEN_ROUNDS"); s != "" {
		n, _ = strconv.Atoi(s) // a shorter run while developing
	}
	for _, mode := range []string{"direct", "relay"} {
		t.Run(mode, func(t *testing.T) {
			faults := []string{"steady", "load"}
			if mode == "relay" {
				faults = append(faults, "takeover")
				if os.Getenv("CUCKOOGUARD_NATS_RESTART") != "" {
					faults = append(faults, "broker restart")
				}
			}
			for _, fault := range faults {
				t.Run(fault, func(t *testing.T) {
					e := newEnv(t, mode == "relay")
					var holder *replica
					if mode == "relay" {
						holder = e.start(t, "holder", nil) // the relay's holder, started first
						waitReady(t, holder)
					}
					a, b, c := e.start(t, "a", nil), e.start(t, "b", nil), e.start(t, "c", nil)
					waitReady(t, a, b, c)
					sa, sb, sc := a.serve(t), b.serve(t), c.serve(t)
					readYourWrites(t, e, n, fault, holder, sa, []*httptest.Server{sb, sc}, b)
				})
			}
		})
	}
}

func readYourWrites(t *testing.T, e *env, n int, fault string, holder *replica, a *httptest.Server, readers []*httptest.Server, b *replica) {
	ctx := context.Background()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	var done, wrong, without atomic.Int64
	var mu sync.Mutex
	var withTok, noTok []time.Duration
	faultDone := make(chan error, 1)
	go func() {
		for done.Load() < int64(n/3) {
			time.Sleep(time.Millisecond)
		}
		switch fault {
		case "takeover":
			t.Log("the relay's holder stops: another replica takes over")
			faultDone <- holder.svc.Close()
		case "load":
			// 1M-row loads, one after another until the clients are done
			// (at most 5).
			e.pool.Exec(ctx, `CREATE TABLE bulk (id bigint, pad text)`)
			var err error
			loads, start := 0, time.Now()
			for ; loads < 5 && err == nil && done.Load() < int64(n); loads++ {
				if _, err = e.pool.Exec(ctx, `TRUNCATE bulk`); err == nil {
					_, err = e.pool.Exec(ctx, `INSERT INTO bulk SELECT g, repeat('x', 40) FROM generate_series(1, 1000000) g`)
				}
			}
			t.Logf("%d loads of 1M rows into a table no replica follows, from a third of the writes on, in %v", loads, time.Since(start).Round(time.Millisecond))
			faultDone <- err
		case "broker restart":
			out, err := exec.Command("sh", "-c", os.Getenv("CUCKOOGUARD_NATS_RESTART")).CombinedOutput()
			t.Logf("the broker restarted: %s", strings.TrimSpace(string(out)))
			faultDone <- err
		default:
			faultDone <- nil
		}
	}()
	get := func(url, token string) (int, time.Duration) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set(middleware.TokenHeader, token)
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Error(err)
			return 0, 0
		}
		resp.Body.Close()
		return resp.StatusCode, time.Since(start)
	}
	const clients = 4
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Add(1) <= int64(n) {
				resp, err := client.Post(a.URL+"/orders", "", nil)
				if err != nil {
					t.Error(err)
					return
				}
				var id int64
				json.NewDecoder(resp.Body).Decode(&id)
				resp.Body.Close()
				token := resp.Header.Get(middleware.TokenHeader)
				if resp.StatusCode != http.StatusOK || token == "" {
					t.Errorf("POST: %d, token %q", resp.StatusCode, token)
					return
				}
				if b.orders.Loader().Ready() && !b.orders.Loader().MayContain(id) {
					without.Add(1)
				}
				for _, r := range readers {
					code, d := get(r.URL+"/orders/"+strconv.FormatInt(id, 10), token)
					if code != http.StatusOK {
						if wrong.Add(1) <= 5 {
							t.Errorf("order %d, created on A, read on %s with its token %s: %d", id, r.URL, token, code)
						}
					}
					mu.Lock()
					withTok = append(withTok, d)
					mu.Unlock()
				}
				_, d := get(readers[0].URL+"/orders/"+strconv.Itoa(1+int(id)%1000), "") // a seed row, without a token
				mu.Lock()
				noTok = append(noTok, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := <-faultDone; err != nil {
		t.Fatalf("%s: %v", fault, err)
	}
	slices.Sort(withTok)
	slices.Sort(noTok)
	pct := func(d []time.Duration, p float64) time.Duration {
		return d[int(float64(len(d)-1)*p)].Round(time.Microsecond)
	}
	st := b.orders.Loader().Stats()
	t.Logf("%s: %d orders created on A and read at once on B and C with their token: %d not found; B's guard alone would have said 404 for %d; on B %d token lookups waited, %d passed through after %v; GET with a token p50 %v p99 %v, GET of an old row without one p50 %v p99 %v",
		fault, n, wrong.Load(), without.Load(), st.TokenWaits, st.TokenPassed, guarded.DefaultTokenWait, pct(withTok, 0.5), pct(withTok, 0.99), pct(noTok, 0.5), pct(noTok, 0.99))
	if wrong.Load() != 0 {
		t.Errorf("%d reads of an order created on another replica answered 404 under its token", wrong.Load())
	}
	if st.TokenForeign != 0 {
		t.Errorf("B took %d tokens for another database's", st.TokenForeign)
	}
}

// TestTableWritesReturnTokens: Insert of a citext key in any case, and
// Delete, return tokens under which another replica reads the write at
// once; the writes are tagged (A's follower skips A's own insert).
func TestTableWritesReturnTokens(t *testing.T) {
	e := newEnv(t, false)
	a, b := e.start(t, "a", nil), e.start(t, "b", nil)
	waitReady(t, a, b)
	ctx := context.Background()
	tok, err := a.customers.Insert(ctx, "Grace@Example.COM", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO customers VALUES ('Grace@Example.COM', 'Grace')`)
		return err
	})
	if err != nil || tok.IsZero() {
		t.Fatalf("Insert: %v, token %v", err, tok)
	}
	k, err := b.customers.Key("GRACE@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := b.customers.Loader().Get(guarded.WithToken(ctx, tok), k); err != nil || c.Name != "Grace" {
		t.Fatalf("B under the insert's token: %v, %v", c, err)
	}
	del, err := a.customers.Delete(ctx, "grace@example.com", func(ctx context.Context, tx pgx.Tx) (bool, error) {
		tag, err := tx.Exec(ctx, `DELETE FROM customers WHERE email = 'grace@example.com'`)
		return tag.RowsAffected() == 1, err
	})
	if err != nil || del.Pos() < tok.Pos() {
		t.Fatalf("Delete: %v, token %v after %v", err, del, tok)
	}
	if _, err := b.customers.Loader().Get(guarded.WithToken(ctx, del), k); !NotFound(err) {
		t.Fatalf("B under the delete's token: %v, want not found", err)
	}
	waitReady(t, a)
	if skipped := a.customers.f.(*postgres.Follower[string]).Stats().Skipped; skipped != 1 {
		t.Errorf("A's follower skipped %d inserts, want its own 1", skipped)
	}
}
