package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/examples/internal/pgtest"
	"github.com/cuckooguard/cuckooguard/examples/userdb"
)

// buildDir holds the binary buildOnce built; TestMain removes it.
var buildDir string

// buildOnce builds the httpapi command once per test binary.
var buildOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "httpapi-bin-*")
	if err != nil {
		return "", err
	}
	buildDir = dir
	bin := filepath.Join(dir, "httpapi")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// proc is one httpapi process.
type proc struct {
	name string
	cmd  *exec.Cmd
	base string // http://addr
	mu   sync.Mutex
	log  []string // its stderr
	done chan struct{}
	err  error // of Wait, once done is closed
}

var listening = regexp.MustCompile(`msg=listening addr=(\S+)`)

// startProc runs httpapi against dsn and waits until it listens.
func startProc(t *testing.T, name, dsn string, args ...string) *proc {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-dsn", dsn, "-origin", name}, args...)...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log = append(p.log, line)
			p.mu.Unlock()
			if m := listening.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			}
		}
		io.Copy(io.Discard, stderr)
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill() // after a clean stop: no effect
		<-p.done
		if t.Failed() {
			t.Logf("%s stderr:\n%s", p.name, strings.Join(p.logLines(), "\n"))
		}
	})
	select {
	case a := <-addr:
		p.base = "http://" + a
	case <-p.done:
		t.Fatalf("%s exited before listening: %v\n%s", name, p.err, strings.Join(p.logLines(), "\n"))
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not listen within 60 s", name)
	}
	return p
}

func (p *proc) logLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

// get returns the status of GET path, or 0 if the request failed.
func get(c *http.Client, url string) int {
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// metric returns the value of the sample named exactly name (with its
// labels) in p's /metrics.
func (p *proc) metric(t *testing.T, c *http.Client, name string) float64 {
	t.Helper()
	resp, err := c.Get(p.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", name, v, err)
			}
			return f
		}
	}
	t.Fatalf("%s: no sample %s in /metrics", p.name, name)
	return 0
}

// waitStatus polls GET url until it answers want, and returns how long
// that took; it fails the test after limit.
func waitStatus(t *testing.T, c *http.Client, url string, want int, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		code := get(c, url)
		if code == want {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("GET %s = %d for %v, want %d", url, code, limit, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestReplicasBlackBox runs two httpapi processes against one PostgreSQL
// database, as a deployment would, and talks to them only over HTTP and
// the database: both become ready; a row POSTed to one is a 200 on the
// other within 1 s, both ways; after the other's stream (replication) backend is
// terminated it answers 200 for every existing row throughout, resyncs
// and is following again; SIGTERM stops both cleanly.
func TestReplicasBlackBox(t *testing.T) {
	dsn := pgtest.Schema(t, pgtest.DSN(t))
	const rows = 2000
	args := []string{"-rows", strconv.Itoa(rows), "-heartbeat", "200ms"}
	// Started together: both install the trigger and seed at once.
	var a, b *proc
	var wg sync.WaitGroup
	wg.Go(func() { a = startProc(t, "a", dsn, args...) })
	wg.Go(func() { b = startProc(t, "b", dsn, args...) })
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 32}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for _, p := range []*proc{a, b} {
		t.Logf("%s ready after %v more", p.name, waitStatus(t, c, p.base+"/readyz", 200, 30*time.Second))
		if code := get(c, p.base+"/healthz"); code != 200 {
			t.Fatalf("%s /healthz = %d", p.name, code)
		}
	}

	post := func(p *proc, id int64) {
		t.Helper()
		resp, err := c.Post(p.base+"/users", "application/json", strings.NewReader(fmt.Sprintf(`{"id": "%d", "name": "n"}`, id)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 201 {
			t.Fatalf("POST %d to %s = %d", id, p.name, resp.StatusCode)
		}
	}
	// A row created through one replica, read through the other.
	var visible []time.Duration
	for i := range 20 {
		src, dst := a, b
		if i%2 == 1 {
			src, dst = b, a
		}
		id := int64(1_000_000 + i)
		post(src, id)
		visible = append(visible, waitStatus(t, c, fmt.Sprintf("%s/users/%d", dst.base, id), 200, time.Second))
	}
	slices.Sort(visible)
	t.Logf("POST on one replica to 200 on the other, 20 rows: median %v, max %v", visible[len(visible)/2], visible[len(visible)-1])
	if code := get(c, b.base+"/users/77777777"); code != 404 {
		t.Fatalf("b: GET of an id nobody created = %d, want 404", code)
	}
	if v := b.metric(t, c, `cuckooguard_http_requests_total{result="rejected"}`); v < 1 {
		t.Fatalf("b: %v requests rejected after a 404 from the guard", v)
	}
	if v := b.metric(t, c, `cuckooguard_follower_state{state="following"}`); v != 1 {
		t.Fatalf("b: follower_state following = %v", v)
	}

	// Kill b's stream backend while readers hammer b with ids that exist,
	// and a keeps creating rows that b must serve too.
	admin, err := userdb.Open(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	failuresBefore := b.metric(t, c, `cuckooguard_follower_session_failures_total{reason="terminated"}`)
	var (
		stop      atomic.Bool
		reads     atomic.Int64
		wrong     atomic.Int64
		created   sync.Map // ids created on a during the fault
		readersWG sync.WaitGroup
	)
	for r := range 4 {
		readersWG.Go(func() {
			for i := r; !stop.Load(); i += 4 {
				id := int64(i%rows + 1)
				if code := get(c, fmt.Sprintf("%s/users/%d", b.base, id)); code != 200 {
					wrong.Add(1)
					t.Errorf("b: GET existing id %d during the fault = %d", id, code)
				}
				reads.Add(1)
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	var killed int
	err = admin.QueryRowContext(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'cuckooguard follower stream b'`).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminated %d stream backends of b (%v), want 1", killed, err)
	}
	kill := time.Now()
	for i := range 20 {
		id := int64(2_000_000 + i)
		post(a, id)
		created.Store(id, true)
		if code := get(c, fmt.Sprintf("%s/users/%d", b.base, id)); code != 200 {
			// Right after the kill b may still be applying; the promise is
			// 200 within the staleness bound, as above.
			waitStatus(t, c, fmt.Sprintf("%s/users/%d", b.base, id), 200, time.Second)
		}
	}
	for b.metric(t, c, `cuckooguard_follower_session_failures_total{reason="terminated"}`) == failuresBefore {
		if time.Since(kill) > 5*time.Second {
			t.Fatal("b's follower did not notice its backend was terminated")
		}
		time.Sleep(5 * time.Millisecond)
	}
	back := waitStatus(t, c, b.base+"/readyz", 200, 10*time.Second)
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	readersWG.Wait()
	t.Logf("b: stream backend terminated; ready again %v after the failure was seen (%v after the kill); %d reads of existing rows, %d not 200",
		back, time.Since(kill), reads.Load(), wrong.Load())
	// Logical decoding resumes where it stopped: the start's read, and no
	// other.
	if v := b.metric(t, c, "cuckooguard_follower_resyncs_total"); v != 1 {
		t.Fatalf("b: %v full reads of the table after a lost connection, want 1 (the start's)", v)
	}
	created.Range(func(k, _ any) bool {
		if code := get(c, fmt.Sprintf("%s/users/%d", b.base, k.(int64))); code != 200 {
			t.Errorf("b: GET %d created on a during the fault = %d after recovery", k, code)
		}
		return true
	})

	// SIGTERM: both drain and stop with status 0. Our idle connections
	// go first: net/http's Shutdown waits up to 5 s for a connection that
	// was opened and never sent a request, and the Transport opens such
	// spares under concurrency.
	tr.CloseIdleConnections()
	term := time.Now()
	for _, p := range []*proc{a, b} {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range []*proc{a, b} {
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not stop within 20 s of SIGTERM", p.name)
		}
		if p.err != nil {
			t.Errorf("%s exited with %v after SIGTERM", p.name, p.err)
		}
		t.Logf("%s stopped %v after SIGTERM", p.name, time.Since(term))
		if !slices.ContainsFunc(p.logLines(), func(l string) bool { return strings.Contains(l, "msg=stopped") }) {
			t.Errorf("%s did not log a clean stop", p.name)
		}
	}
}
