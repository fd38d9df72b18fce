package fanout

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The stream's faults: each writes through another client while a
// replica follows, and checks every committed key on every replica. A
// lookup that reads absent a row committed staleBound or more before it,
// on a ready replica, is a wrong 404.

// staleBound is how old a committed row must be for a 404 on a ready
// replica to be wrong.
const staleBound = 300 * time.Millisecond

// jsOf returns a JetStream context on the test's connection.
func (e *env) jsOf(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// waitStream waits until the test's stream exists (a relay made it).
func (e *env) waitStream(t *testing.T, within time.Duration) {
	t.Helper()
	js := e.jsOf(t)
	for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		if _, err := js.Stream(context.Background(), "CG_"+e.id); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream CG_%s %v after it was deleted: the relay never made it again", e.id, within)
		}
	}
}

// TestStreamDeleted deletes the stream while a replica follows and
// another process writes: the replica passes through while its stream is
// gone, the relay makes the stream again, and the replica reads the table
// and follows again, with no wrong 404.
func TestStreamDeleted(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 500)
	e.startRelay(t, "r_deleted", "users")
	a := e.startNode(t, "a", "users")
	l := startLoad(t, e, []*node{a}, staleBound)
	time.Sleep(300 * time.Millisecond)
	if err := e.jsOf(t).DeleteStream(context.Background(), "CG_"+e.id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // rows committed while the stream is gone
	e.waitStream(t, 10*time.Second)
	a.waitCurrent(t)
	time.Sleep(300 * time.Millisecond)
	l.halt()
	st := a.f.Stats()
	t.Logf("%d Gets, %d while passing through, %d wrong 404s; %+v", l.gets.Load(), l.passing.Load(), l.wrong.Load(), st)
	if st.Reads[readStream]+st.Reads[readReset]+st.Reads[readGap] == 0 {
		t.Errorf("the replica never read the table after its stream was deleted: %+v", st)
	}
	expectNoWrong404s(t, a, "after the stream was deleted and made again")
}

// restartNATS runs CUCKOOGUARD_NATS_RESTART (a command that restarts the
// test's nats-server) with args, or skips the test without it.
func restartNATS(t *testing.T, args ...string) {
	t.Helper()
	cmd := os.Getenv("CUCKOOGUARD_NATS_RESTART")
	if cmd == "" {
		t.Skip("set CUCKOOGUARD_NATS_RESTART to a command that restarts the test's nats-server ([wipe|keep] [seconds down]); .ci/run does")
	}
	if out, err := exec.Command("sh", "-c", cmd+" "+strings.Join(args, " ")).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", cmd, args, err, out)
	}
}

// TestBrokerLosesItsStorage restarts nats-server without its storage: the
// stream and everything in it are gone. The replica passes through, the
// relay makes the stream again, and the replica reads the table.
func TestBrokerLosesItsStorage(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 500)
	e.startRelay(t, "r_wiped", "users")
	a := e.startNode(t, "a", "users")
	l := startLoad(t, e, []*node{a}, staleBound)
	time.Sleep(300 * time.Millisecond)
	restartNATS(t, "wipe")
	e.waitStream(t, 15*time.Second)
	a.waitCurrent(t)
	time.Sleep(300 * time.Millisecond)
	l.halt()
	t.Logf("%d Gets, %d while passing through, %d wrong 404s; %+v", l.gets.Load(), l.passing.Load(), l.wrong.Load(), a.f.Stats())
	expectNoWrong404s(t, a, "after the broker lost its storage")
}

// TestBrokerOutage cuts a replica with the default settings off the
// broker for 5 s twice: silently (its packets go nowhere, its connection
// stays open), then loudly (nats-server down, and up again with its
// storage). Either way it passes through within its max lag, and follows
// again once the broker is back.
func TestBrokerOutage(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 500)
	e.startRelay(t, "r_outage", "users")
	p, nc := natsViaProxy(t)
	a := e.startNodeOn(t, nc, "a", "users", WithHeartbeat(DefaultHeartbeat), WithMaxLag(DefaultMaxLag))
	l := startLoad(t, e, []*node{a}, staleBound)
	time.Sleep(time.Second)
	p.Stall()
	time.Sleep(5 * time.Second)
	p.Resume()
	a.waitCurrent(t)
	t.Logf("silent outage: %d Gets, %d while passing through, %d wrong 404s", l.gets.Load(), l.passing.Load(), l.wrong.Load())
	time.Sleep(time.Second)
	restartNATS(t, "keep", "5")
	a.waitCurrent(t)
	time.Sleep(300 * time.Millisecond)
	l.halt()
	t.Logf("and the server down: %d Gets, %d while passing through, %d wrong 404s; %+v", l.gets.Load(), l.passing.Load(), l.wrong.Load(), a.f.Stats())
	expectNoWrong404s(t, a, "after 5 s broker outages")
}

// saveAndStop starts a node that saves its guard, waits for a save, and
// stops it.
func (e *env) saveAndStop(t *testing.T, id string) {
	t.Helper()
	a := e.startNode(t, id, "users", WithSnapshots(e.bucket(), 50*time.Millisecond, func() bool { return true }))
	for deadline := time.Now().Add(10 * time.Second); a.f.Stats().SnapshotsSaved == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no guard saved")
		}
	}
	a.stop()
}

// TestRestoreAfterPurge saves a guard, commits rows, and purges the stream
// to no message at all: a new replica must not start from the guard, whose
// missing rows no stream holds any more.
func TestRestoreAfterPurge(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 100)
	e.startRelay(t, "r_purged", "users")
	e.saveAndStop(t, "a")
	w := e.startNode(t, "w", "users", WithSnapshots("", 0, nil))
	e.exec(t, `INSERT INTO users SELECT g, 'after the save' FROM generate_series(1000, 1049) g`)
	w.waitCurrent(t)
	stream, err := e.jsOf(t).Stream(context.Background(), "CG_"+e.id)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := e.startNode(t, "b", "users")
	t.Logf("b: %+v", b.f.Stats())
	if st := b.f.Stats(); st.SnapshotStarts != 0 && len(st.Reads) == 0 {
		t.Errorf("b started from a guard older than what the purged stream still holds: %+v", st)
	}
	expectNoWrong404s(t, b, "a new replica after the stream was purged to no message")
}

// TestRestoreFromDeletedStream saves a guard, then the stream is deleted
// and made again, and rows committed: the saved guard's sequence means
// nothing in the new stream, and a new replica must read the table.
func TestRestoreFromDeletedStream(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 100)
	e.startRelay(t, "r_remade", "users")
	e.saveAndStop(t, "a")
	if err := e.jsOf(t).DeleteStream(context.Background(), "CG_"+e.id); err != nil {
		t.Fatal(err)
	}
	e.waitStream(t, 10*time.Second)
	w := e.startNode(t, "w", "users", WithSnapshots("", 0, nil))
	for i := range 5 {
		e.exec(t, `INSERT INTO users SELECT g, 'new stream' FROM generate_series(2000+`+itoa(i*10)+`, 2009+`+itoa(i*10)+`) g`)
	}
	w.waitCurrent(t)
	b := e.startNode(t, "b", "users")
	if st := b.f.Stats(); st.SnapshotStarts != 0 {
		t.Errorf("b started from a guard saved in a stream since deleted: %+v", st)
	}
	expectNoWrong404s(t, b, "a new replica after the stream was deleted and made again")
}

// TestCutOffPastMaxAge cuts a replica off NATS (its packets go nowhere,
// its connection stays open) for longer than the stream keeps messages:
// the rows committed meanwhile leave the stream before it can read them.
// It passes through while cut off, finds that it missed messages once
// back, and reads the table.
func TestCutOffPastMaxAge(t *testing.T) {
	e := newEnv(t)
	e.table(t, "users", 500)
	e.startRelayWith(t, "r_aged", tablesOf("users"), []Option{WithMaxAge(time.Second)})
	p, nc := natsViaProxy(t)
	a := e.startNodeOn(t, nc, "a", "users")
	l := startLoad(t, e, []*node{a}, staleBound)
	time.Sleep(300 * time.Millisecond)
	p.Stall()
	time.Sleep(2500 * time.Millisecond)
	p.Resume()
	a.waitCurrent(t)
	time.Sleep(300 * time.Millisecond)
	l.halt()
	st := a.f.Stats()
	t.Logf("%d Gets, %d while passing through, %d wrong 404s; %+v", l.gets.Load(), l.passing.Load(), l.wrong.Load(), st)
	expectNoWrong404s(t, a, "after missing messages that aged out")
}
