package fanout

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/mysql"
)

// TestMeasureMySQLRelayWriteTax measures, with CUCKOOGUARD_MEASURE=1, what
// following a MariaDB table costs the server's writers: the single-row
// autocommit inserts per second that 8 writers commit with no follower,
// with 8 direct mysql.Followers (8 binlog dump threads, 8 heartbeat
// rows), with 1 relay and 1 relayed Follower, and with 1 relay and 8
// relayed Followers (one dump thread; the relay's probes and heartbeats
// and each Follower's control-row heartbeats are writes of their own).
// The writers insert into the followed table, and into a table nobody
// follows (whose writers pay only for the binlog's readers), for
// CUCKOOGUARD_PHASE (5 s) each: as fast as they go, or, with
// CUCKOOGUARD_RATE, that many a second in all (the server's CPU per
// insert then tells its cost while the machine's cores are not all
// taken). The modes alternate in rounds (CUCKOOGUARD_ROUNDS, 3 by
// default), so that drift falls on all of them. It logs each mode's rate
// against no follower's in the same round, the median of those ratios,
// and per insert: the CPU time of the server (from /proc, if it runs on
// this machine), of this process and of the whole machine, and the
// commits of others that the binlog counted (Binlog_commits less the
// inserts). It asserts nothing of time; it fails if a follower does not
// keep up or a relayed one reports a committed key absent.
func TestMeasureMySQLRelayWriteTax(t *testing.T) {
	if os.Getenv("CUCKOOGUARD_MEASURE") == "" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure")
	}
	e := newMyEnv(t)
	admin := e.conn(t)
	other := e.table + "_u"
	myExec(t, admin, "CREATE TABLE `"+other+"` LIKE `"+e.table+"`")
	t.Cleanup(func() {
		if c, err := client.Connect(e.addr, e.user, e.pass, e.dbn); err == nil {
			c.Execute("DROP TABLE IF EXISTS `" + other + "`")
			c.Close()
		}
	})
	rounds, d := 3, 5*time.Second
	if n, err := strconv.Atoi(os.Getenv("CUCKOOGUARD_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	if p, err := time.ParseDuration(os.Getenv("CUCKOOGUARD_PHASE")); err == nil && p > 0 {
		d = p
	}
	rate, _ := strconv.Atoi(os.Getenv("CUCKOOGUARD_RATE"))
	pid := serverPID(admin)
	modes := []string{"none", "direct8", "relay1", "relay8"}
	targets := []string{e.table, other}
	type sample struct {
		rate    float64 // inserts per second
		cpu     float64 // the server's CPU µs per insert; 0 if unknown
		self    float64 // this process's (writers, relay, followers) CPU µs per insert
		machine float64 // the machine's busy CPU µs per insert (NATS and any other process too)
		extra   float64 // others' binlog commits per insert
		groups  float64 // binlog group commits per insert
		inserts int64
	}
	got := map[string]map[string][]sample{}
	for _, m := range modes {
		got[m] = map[string][]sample{}
	}
	var next atomic.Int64
	next.Store(1_000_000_000)
	for r := range rounds {
		for _, m := range modes {
			fl := e.startMyFleet(t, m)
			order := targets
			if r%2 == 1 {
				order = []string{other, e.table}
			}
			for _, table := range order {
				cpu0, self0, busy0, st0 := serverCPU(pid), serverCPU(os.Getpid()), machineBusy(), binlogStatus(t, admin)
				inserts := e.insertFor(t, table, 8, rate, d, &next)
				cpu1, self1, busy1, st1 := serverCPU(pid), serverCPU(os.Getpid()), machineBusy(), binlogStatus(t, admin)
				perInsert := func(ticks int64) float64 { return float64(ticks*(1_000_000/clockTicks)) / float64(inserts) }
				s := sample{rate: float64(inserts) / d.Seconds(), inserts: inserts,
					self: perInsert(self1 - self0), machine: perInsert(busy1 - busy0),
					extra:  float64(st1.commits-st0.commits-inserts) / float64(inserts),
					groups: float64(st1.groups-st0.groups) / float64(inserts)}
				if pid != 0 {
					s.cpu = perInsert(cpu1 - cpu0)
				}
				got[m][table] = append(got[m][table], s)
			}
			fl.stop(t) // after checking that every follower kept up
		}
	}
	median := func(xs []float64) float64 {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		if n := len(xs); n%2 == 0 {
			return (xs[n/2-1] + xs[n/2]) / 2
		}
		return xs[len(xs)/2]
	}
	paced := "as fast as they go"
	if rate > 0 {
		paced = fmt.Sprintf("paced at %d/s in all", rate)
	}
	t.Logf("8 writers of single-row autocommit inserts, %s, %v a phase, %d rounds; %d cores (GOMAXPROCS %d) shared by the server, NATS, the writers, the relay and the followers; server pid %d",
		paced, d, rounds, runtime.NumCPU(), runtime.GOMAXPROCS(0), pid)
	for _, table := range targets {
		what := "the followed table"
		if table == other {
			what = "a table nobody follows"
		}
		for _, m := range modes {
			var ratios, rates, cpus, selfs, busy, extras, groups []float64
			var line strings.Builder
			for r, s := range got[m][table] {
				ratio := s.rate / got["none"][table][r].rate
				ratios, rates, cpus, selfs, busy = append(ratios, ratio), append(rates, s.rate), append(cpus, s.cpu), append(selfs, s.self), append(busy, s.machine)
				extras, groups = append(extras, s.extra), append(groups, s.groups)
				fmt.Fprintf(&line, " %.0f/s (%.2fx)", s.rate, ratio)
			}
			t.Logf("inserts into %s, %-7s:%s; median %.0f/s, %.2fx of none; per insert (medians): CPU µs: server %.0f, this process %.0f, machine %.0f; others' commits %.3f, group commits %.3f",
				what, m, line.String(), median(rates), median(ratios), median(cpus), median(selfs), median(busy), median(extras), median(groups))
		}
	}
}

// myFleet is what a mode of TestMeasureMySQLRelayWriteTax runs: followers
// and, through a relay, the relay.
type myFleet struct {
	current []func() (follow.State, time.Time) // each follower's state, and as of when it is current
	ready   []func() bool                      // each follower's Loader is ready
	check   *myNode                            // a relayed follower whose keys are checked
	stops   []func()
}

// startMyFleet starts the followers of mode ("none", "direct8",
// "relay1" or "relay8"), with their default heartbeats, and waits until
// every one follows.
func (e *myEnv) startMyFleet(t *testing.T, mode string) *myFleet {
	t.Helper()
	fl := &myFleet{}
	if mode == "none" {
		return fl
	}
	n, _ := strconv.Atoi(mode[len(mode)-1:])
	relayed := strings.HasPrefix(mode, "relay")
	if relayed {
		r, err := NewRelay(e.db, e.relay, e.nc, []follow.Table{{Table: e.table, Key: "id"}}, append([]Option{WithLogger(testLogger(t))}, e.opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		fl.stops = append(fl.stops, runUntilStopped(t, "relay", r.Run))
		waitLeading(t, r)
	}
	parse := func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
	for i := range n {
		g, err := guard.New(guard.WithCapacity(1 << 20))
		if err != nil {
			t.Fatal(err)
		}
		l, err := guarded.New(g, guarded.GetterFunc[int64, string](func(context.Context, int64) (string, error) {
			return "", guarded.ErrNotFound // MayContain alone is checked
		}))
		if err != nil {
			t.Fatal(err)
		}
		var run func(context.Context) error
		if relayed {
			id := fmt.Sprintf("m%d", i)
			f, err := NewFollower(l, e.nc, e.db, e.table, "id", parse,
				append([]Option{WithOrigin(id), WithRelay(e.relay), WithLogger(testLogger(t))}, e.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			run = f.Run
			fl.current = append(fl.current, func() (follow.State, time.Time) { st := f.Stats(); return st.State, st.CurrentAsOf })
			if i == 0 {
				fl.check = &myNode{id: id, e: e, conn: e.conn(t), loader: l, f: f}
			}
		} else {
			f, err := mysql.NewFollower(l, e.dsn, e.table, "id", parse)
			if err != nil {
				t.Fatal(err)
			}
			run = f.Run
			fl.current = append(fl.current, func() (follow.State, time.Time) {
				st := f.Stats()
				if st.State != mysql.Following {
					return follow.Resyncing, st.CurrentAsOf
				}
				return follow.Following, st.CurrentAsOf
			})
		}
		fl.ready = append(fl.ready, l.Ready)
		stop := runUntilStopped(t, mode+" follower", run)
		fl.stops = append(fl.stops, func() { stop(); l.Close() })
	}
	fl.waitCurrent(t)
	return fl
}

// waitCurrent waits until every follower follows with every change
// committed before the call applied.
func (fl *myFleet) waitCurrent(t *testing.T) {
	t.Helper()
	since := time.Now()
	for i, cur := range fl.current {
		for deadline := since.Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
			st, asOf := cur()
			if st == follow.Following && fl.ready[i]() && asOf.After(since) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("follower %d never followed with the changes before %v (%v)", i, since.Format(time.StampMilli), st)
			}
		}
	}
}

// stop checks that every follower kept up, and a relayed one's keys, and
// stops them, the relay last.
func (fl *myFleet) stop(t *testing.T) {
	t.Helper()
	fl.waitCurrent(t)
	if fl.check != nil {
		fl.check.e.check(t, "after the inserts", fl.check)
	}
	for i := len(fl.stops) - 1; i >= 0; i-- {
		fl.stops[i]()
	}
}

// insertFor runs n writers that insert one row at a time (autocommit)
// into table, with ids from next, for d, and returns the rows inserted:
// as fast as they can, or, if rate is not 0, rate a second in all. The
// writers connect before the clock starts.
func (e *myEnv) insertFor(t *testing.T, table string, n, rate int, d time.Duration, next *atomic.Int64) int64 {
	t.Helper()
	conns := make([]*client.Conn, n)
	for i := range conns {
		c, err := client.ConnectWithTimeout(e.addr, e.user, e.pass, e.dbn, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	var inserted atomic.Int64
	var failed atomic.Pointer[error]
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				if rate > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(i) * time.Duration(n) * time.Second / time.Duration(rate))))
				}
				if _, err := c.Execute(fmt.Sprintf("INSERT INTO `%s` VALUES (%d, 'w')", table, next.Add(1))); err != nil {
					failed.Store(&err)
					return
				}
				inserted.Add(1)
			}
		})
	}
	wg.Wait()
	for _, c := range conns {
		c.Close()
	}
	if err := failed.Load(); err != nil {
		t.Fatalf("insert into %s: %v", table, *err)
	}
	return inserted.Load()
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's
// times: 100 on Linux.
const clockTicks = 100

// serverPID returns the pid of the server behind c if it runs on this
// machine (its pid file is readable), or 0.
func serverPID(c *client.Conn) int {
	r, err := c.Execute("SELECT @@pid_file")
	if err != nil {
		return 0
	}
	file, _ := r.GetString(0, 0)
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if serverCPU(pid) == 0 {
		return 0
	}
	return pid
}

// serverCPU returns the user and system time of process pid, in clock
// ticks; 0 if unknown.
func serverCPU(pid int) int64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name, in parentheses: state is the
	// first, utime and stime the 12th and 13th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// machineBusy returns the machine's CPU time not idle (nor waiting for
// I/O), in clock ticks, from /proc/stat; 0 if unknown.
func machineBusy() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 {
			continue // idle, iowait
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return busy
}

// binlogCounts is the server's count of binlog commits and group commits.
type binlogCounts struct{ commits, groups int64 }

func binlogStatus(t *testing.T, c *client.Conn) binlogCounts {
	t.Helper()
	r, err := c.Execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('Binlog_commits', 'Binlog_group_commits')")
	if err != nil {
		t.Fatal(err)
	}
	var out binlogCounts
	for i := range r.RowNumber() {
		name, _ := r.GetString(i, 0)
		v, _ := r.GetString(i, 1)
		n, _ := strconv.ParseInt(v, 10, 64)
		switch name {
		case "Binlog_commits":
			out.commits = n
		case "Binlog_group_commits":
			out.groups = n
		}
	}
	return out
}
