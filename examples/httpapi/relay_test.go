package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/examples/internal/pgtest"
	"github.com/cuckooguard/cuckooguard/examples/userdb"
)

// TestRelayBlackBox runs three httpapi processes with -nats against one
// database and one nats-server, and talks to them over HTTP and the
// database only: one of them relays (cuckooguard_fanout_relay_leading),
// the database holds one slot for them all, and each becomes ready with
// every row committed before it (checked row by row); rows POSTed to one
// and rows another client inserts are 200 on the others; after the
// relaying process is killed another takes over, and rows committed
// meanwhile are 200 on every survivor once it is ready again.
func TestRelayBlackBox(t *testing.T) {
	natsURL := os.Getenv("CUCKOOGUARD_NATS_URL")
	if natsURL == "" {
		t.Skip("set CUCKOOGUARD_NATS_URL (a nats-server with JetStream) to run (.ci/run starts one)")
	}
	ctx := context.Background()
	dsn := pgtest.Schema(t, pgtest.DSN(t))
	u, _ := url.Parse(dsn)
	schema := u.Query().Get("search_path")
	admin, err := userdb.Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	slot := "cg_relay_httpapi_" + schema
	t.Cleanup(func() { // after the processes' cleanups: they hold the slot
		admin.ExecContext(ctx, `SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1`, slot)
	})
	const rows = 2000
	args := []string{"-rows", strconv.Itoa(rows), "-heartbeat", "200ms", "-nats", natsURL, "-service", "httpapi_" + schema}
	procs := []*proc{startProc(t, "a", dsn, args...)}
	procs = append(procs, startProc(t, "b", dsn, args...), startProc(t, "c", dsn, args...))
	tr := &http.Transport{MaxIdleConnsPerHost: 32}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	// Another client's rows, committed before the check of each process.
	insert := func(from, to int64) {
		t.Helper()
		q := fmt.Sprintf(`INSERT INTO %s.users (id, name) SELECT g, 'other' FROM generate_series(%d, %d) g`, schema, from, to)
		if _, err := admin.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// everyRow checks every row of users is a 200 on p, once p is ready.
	everyRow := func(p *proc, what string) {
		t.Helper()
		waitStatus(t, c, p.base+"/readyz", 200, 30*time.Second)
		ids, err := admin.QueryContext(ctx, fmt.Sprintf(`SELECT id FROM %s.users`, schema))
		if err != nil {
			t.Fatal(err)
		}
		defer ids.Close()
		n, wrong := 0, 0
		for ids.Next() {
			var id int64
			ids.Scan(&id)
			n++
			if code := get(c, fmt.Sprintf("%s/users/%d", p.base, id)); code != 200 {
				wrong++
				if wrong <= 5 {
					t.Errorf("%s: %s: GET committed row %d = %d", p.name, what, id, code)
				}
			}
		}
		t.Logf("%s: %s: %d committed rows, %d not 200", p.name, what, n, wrong)
	}
	insert(10_000, 10_099)
	for _, p := range procs {
		everyRow(p, "ready")
	}
	leader := func(ps []*proc) (*proc, int) {
		var l *proc
		n := 0
		for _, p := range ps {
			if p.metric(t, c, "cuckooguard_fanout_relay_leading") == 1 {
				l, n = p, n+1
			}
		}
		return l, n
	}
	l, n := leader(procs)
	if n != 1 {
		t.Fatalf("%d processes relay, want 1", n)
	}
	var walsenders int
	admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name LIKE 'cuckooguard relay stream httpapi%'||$1||'%'`, schema).Scan(&walsenders)
	var slots int
	admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'cg_%'||$1||'%'`, schema).Scan(&slots)
	t.Logf("%s relays; %d walsenders and %d slots for the three", l.name, walsenders, slots)
	if slots != 1 {
		t.Errorf("%d slots for the schema's replicas, want 1 (the relay's)", slots)
	}
	// A row POSTed to each, read through the others.
	for i, src := range procs {
		id := int64(20_000 + i)
		resp, err := c.Post(src.base+"/users", "application/json", strings.NewReader(fmt.Sprintf(`{"id": %d, "name": "n"}`, id)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 201 {
			t.Fatalf("POST %d to %s = %d", id, src.name, resp.StatusCode)
		}
		for _, dst := range procs {
			waitStatus(t, c, fmt.Sprintf("%s/users/%d", dst.base, id), 200, 5*time.Second)
		}
	}

	// The relay dies: another takes over.
	l.cmd.Process.Signal(syscall.SIGKILL)
	<-l.done
	killed := time.Now()
	var rest []*proc
	for _, p := range procs {
		if p != l {
			rest = append(rest, p)
		}
	}
	insert(30_000, 30_099)
	for {
		if nl, n := leader(rest); n == 1 {
			t.Logf("%s relays %v after %s was killed", nl.name, time.Since(killed).Round(time.Millisecond), l.name)
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatal("no survivor relays 30 s after the relay was killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	insert(30_100, 30_199)
	for _, p := range rest {
		everyRow(p, "after the relay was killed")
	}
	if code := get(c, rest[0].base+"/users/77777777"); code != 404 {
		t.Errorf("%s: GET of an id nobody created = %d, want 404", rest[0].name, code)
	}
}
