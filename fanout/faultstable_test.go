package fanout

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// relayProc is a relay in a process of its own (TestRelayProcess).
type relayProc struct {
	cmd     *exec.Cmd
	leading atomic.Bool
	exited  chan struct{}
	mu      sync.Mutex
	out     strings.Builder
}

// startRelayProc starts a relay process of e's users table, named name,
// with heartbeat hb ("" for the default).
func (e *env) startRelayProc(t *testing.T, name, hb string) *relayProc {
	t.Helper()
	p := &relayProc{exited: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "-test.run=^TestRelayProcess$")
	p.cmd.Env = append(os.Environ(), relayProcessEnv+"="+strings.Join([]string{e.dsn, os.Getenv("CUCKOOGUARD_NATS_URL"), e.id, name, hb}, "\t"))
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = p.cmd.Stdout
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			switch line := sc.Text(); line {
			case "leading":
				p.leading.Store(true)
			case "following":
				p.leading.Store(false)
			default:
				p.mu.Lock()
				p.out.WriteString(line + "\n")
				p.mu.Unlock()
			}
		}
		io.Copy(io.Discard, stdout)
		p.cmd.Wait()
		p.leading.Store(false)
	}()
	t.Cleanup(func() { p.end(t) })
	return p
}

// end ends the process: SIGTERM, or SIGKILL after 10 s.
func (p *relayProc) end(t *testing.T) {
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("a relay process did not end within 10 s of SIGTERM")
	}
}

// TestFaultsTable measures, with the default settings (follower heartbeat
// 100 ms and max lag 150 ms, relay heartbeat 500 ms), what each fault of a
// fleet does to three replicas that follow through a relay, while another
// process commits a row every millisecond and checkers read recent rows
// through every replica: how long after the fault began the first replica
// passed lookups through, how long until all three followed again, and the
// wrong 404s (a row committed 300 ms or more before the lookup, read absent
// on a ready replica). It prints the README's table. Set
// CUCKOOGUARD_MEASURE=1, CUCKOOGUARD_NATS_RESTART and, for the PostgreSQL
// restart, CUCKOOGUARD_PG_RESTART (nothing else may use the servers).
func TestFaultsTable(t *testing.T) {
	if os.Getenv("CUCKOOGUARD_MEASURE") == "" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure")
	}
	e := newEnv(t)
	e.table(t, "users", 100_000)
	e.exec(t, `CREATE TABLE unrelated (id bigint PRIMARY KEY, pad text)`)
	name := "r_table"
	e.relays = append(e.relays, name)
	procs := []*relayProc{e.startRelayProc(t, name, "")}
	defaults := []Option{WithRelay(name), WithHeartbeat(DefaultHeartbeat), WithMaxLag(DefaultMaxLag), WithHeartbeatDeadline(DefaultFollowerDeadline)}
	var nodes []*node
	for _, id := range []string{"a", "b", "c"} {
		nodes = append(nodes, e.startNode(t, id, "users", defaults...))
	}
	for range 2 {
		procs = append(procs, e.startRelayProc(t, name, ""))
	}
	l := startLoad(t, e, nodes, staleBound)
	// Sampled every millisecond: when the first replica passes through.
	var passedAt atomic.Int64
	sctx, stopSampling := context.WithCancel(context.Background())
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for tick := time.NewTicker(time.Millisecond); sctx.Err() == nil; <-tick.C {
			for _, n := range nodes {
				if !n.loader.Ready() {
					passedAt.CompareAndSwap(0, time.Now().UnixNano())
				}
			}
		}
	})
	defer func() { stopSampling(); sampling.Wait() }()
	leader := func() *relayProc {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			for _, p := range procs {
				if p.leading.Load() {
					return p
				}
			}
		}
		t.Fatal("no relay process leads")
		return nil
	}
	type row struct {
		fault        string
		pass, follow string
		wrong        int64
		gets         int64
	}
	var rows []row
	only := regexp.MustCompile(os.Getenv("CUCKOOGUARD_FAULTS")) // a subset, for a quick look
	measure := func(fault string, do func()) {
		if !only.MatchString(fault) {
			return
		}
		time.Sleep(time.Second)
		wrongBefore, getsBefore := l.wrong.Load(), l.gets.Load()
		passedAt.Store(0)
		begin := time.Now()
		do()
		// A fault may take the replicas out of rotation a little after it
		// began: give it 2 s to.
		for deadline := time.Now().Add(2 * time.Second); passedAt.Load() == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		}
		for _, n := range nodes {
			n.waitCurrent(t)
		}
		back := time.Since(begin)
		r := row{fault: fault, pass: "none", follow: "–"}
		if p := passedAt.Load(); p != 0 {
			r.pass = time.Unix(0, p).Sub(begin).Round(time.Millisecond).String()
			r.follow = back.Round(time.Millisecond).String()
		}
		time.Sleep(time.Second)
		r.wrong, r.gets = l.wrong.Load()-wrongBefore, l.gets.Load()-getsBefore
		t.Logf("%s: pass-through after %s, all following again after %s, %d wrong 404s in %d lookups", fault, r.pass, r.follow, r.wrong, r.gets)
		rows = append(rows, r)
	}
	time.Sleep(time.Second)
	measure("relay killed (SIGKILL)", func() {
		p := leader()
		p.cmd.Process.Kill()
		<-p.exited
	})
	measure("relay stopped for 20 s (SIGSTOP)", func() {
		p := leader()
		p.cmd.Process.Signal(syscall.SIGSTOP)
		time.AfterFunc(20*time.Second, func() { p.cmd.Process.Signal(syscall.SIGCONT) })
	})
	time.Sleep(20 * time.Second) // the stopped relay wakes
	if os.Getenv("CUCKOOGUARD_NATS_RESTART") != "" {
		measure("nats-server restarted, with its storage", func() { restartNATS(t) })
		measure("nats-server restarted without its storage", func() { restartNATS(t, "wipe") })
		measure("nats-server down for 10 s", func() { restartNATS(t, "keep", "10") })
	}
	measure("stream deleted", func() {
		if err := e.jsOf(t).DeleteStream(context.Background(), "CG_"+e.id); err != nil {
			t.Fatal(err)
		}
	})
	measure("stream purged", func() {
		s, err := e.jsOf(t).Stream(context.Background(), "CG_"+e.id)
		if err == nil {
			err = s.Purge(context.Background())
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	if cmd := os.Getenv("CUCKOOGUARD_PG_RESTART"); cmd != "" {
		measure("PostgreSQL restarted", func() {
			if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cmd, err, out)
			}
		})
	}
	measure("1M rows loaded into an unfollowed table", func() {
		c, err := pgx.Connect(context.Background(), e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), `INSERT INTO unrelated SELECT g, repeat('x', 100) FROM generate_series(1, 1000000) g`); err != nil {
			t.Fatal(err)
		}
	})
	l.halt()
	var b strings.Builder
	b.WriteString("\n| fault | to pass-through | all three following again | wrong 404s (of lookups) |\n|---|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %d (of %d) |\n", r.fault, r.pass, r.follow, r.wrong, r.gets)
	}
	t.Log(b.String())
	for _, n := range nodes {
		expectNoWrong404s(t, n, "after every fault")
	}
}
