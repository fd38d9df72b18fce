package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/examples/internal/pgtest"
)

// TestServerRestartAnswers503 is the third defect of the client-found
// issue: during pg_ctl restart -m fast the service answered 500 without
// Retry-After, because PostgreSQL's "terminating connection due to
// administrator command" (57P01) and pgx's "conn closed" were not taken
// for an unavailable database. Readers and writers run through the
// restart; every answer must be 200, 201, 404 or 503 with Retry-After, and
// every row created (201) must read 200 afterwards.
//
// It restarts the server with the shell command in CUCKOOGUARD_PG_RESTART,
// which breaks every other user of the server: .ci/run runs it on its own,
// after the module's tests.
func TestServerRestartAnswers503(t *testing.T) {
	cmd := os.Getenv("CUCKOOGUARD_PG_RESTART")
	if cmd == "" {
		t.Skip(`set CUCKOOGUARD_PG_RESTART to a shell command that restarts the test server (.ci/run runs this test on its own with it)`)
	}
	_, base := startReplica(t, pgtest.Schema(t, pgtest.DSN(t)), 1000)
	c := client{t: t, base: base, c: &http.Client{Timeout: 30 * time.Second}}

	var (
		mu      sync.Mutex
		codes   = map[string]int{} // "GET 200", "POST 503", …
		bad     []string
		created []int64
		nextID  atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	nextID.Store(1_000_000)
	record := func(method string, code int, h http.Header, body []byte) {
		mu.Lock()
		defer mu.Unlock()
		codes[fmt.Sprintf("%s %d", method, code)]++
		ok := code == 200 || code == 201 || code == 404 || code == 409 || code == 503 && h.Get("Retry-After") != ""
		if !ok && len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("%s %d %s", method, code, body))
		}
	}
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if w == 0 {
					id := nextID.Add(1)
					code, h, b := c.doHeader("POST", "/users", map[string]string{"id": strconv.FormatInt(id, 10), "name": "r"})
					record("POST", code, h, b)
					if code == 201 {
						mu.Lock()
						created = append(created, id)
						mu.Unlock()
					}
					continue
				}
				id := int64(1 + i%1000) // present
				if i%2 == 1 {
					id = 5_000_000 + int64(i) // absent
				}
				code, h, b := c.doHeader("GET", "/users/"+strconv.FormatInt(id, 10), nil)
				record("GET", code, h, b)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("restart: %v\n%s", err, out)
	}
	t.Logf("server restarted in %v", time.Since(start))
	// Keep the load on until a write is accepted after the restart.
	mu.Lock()
	before := len(created)
	mu.Unlock()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		after := len(created) - before
		mu.Unlock()
		if after > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no write accepted in 30 s after the restart")
		}
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("answers during the restart: %v", codes)
	if len(bad) > 0 {
		t.Fatalf("answers other than 200, 201, 404, 409 or 503 with Retry-After: %q", bad)
	}
	if codes["GET 503"]+codes["POST 503"] == 0 {
		t.Fatal("no 503 at all: the restart was not seen; the test checks nothing")
	}
	for _, id := range created {
		if code, b := c.do("GET", "/users/"+strconv.FormatInt(id, 10), nil); code != 200 {
			t.Fatalf("GET of user %d, created (201) around the restart = %d %s", id, code, b)
		}
	}
}
