package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/go-mysql-org/go-mysql/client"
)

// connTx runs Tag's statements on a connection, in its open transaction.
type connTx struct{ c *client.Conn }

func (x connTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	_, err := x.c.Execute(query, args...)
	return nil, err
}

// insertOwn inserts id through n's Loader, in a transaction of c that
// names it with Tag if tagged.
func insertOwn(ctx context.Context, n *node[int64], c *client.Conn, table string, id int64, tagged bool) error {
	return n.loader.Insert(ctx, id, func(ctx context.Context) error {
		if _, err := c.Execute("BEGIN"); err != nil {
			return err
		}
		_, err := c.Execute(fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, id))
		if err == nil && tagged {
			err = n.follower.Tag(ctx, connTx{c}, id)
		}
		if err != nil {
			c.Execute("ROLLBACK") //nolint:errcheck // the error that matters is err
			return err
		}
		_, err = c.Execute("COMMIT")
		return err
	})
}

// TestOwnInserts writes rows through the Loader's Insert, untagged and
// tagged: each key reads present from the moment Insert returns; the
// binlog then brings its insert, which the Follower applies again (a
// second copy) unless the transaction tagged the key. It measures the
// copies beyond the rows, and the keys that still read present after
// their rows are deleted.
func TestOwnInserts(t *testing.T) {
	srv := testDSN(t)
	ctx := context.Background()
	for _, tagged := range []bool{false, true} {
		t.Run(fmt.Sprintf("tagged=%v", tagged), func(t *testing.T) {
			table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY", "")
			n := startNode(t, srv, table, "id", parseInt64)
			n.waitCurrent(t)
			w := connect(t, srv)
			const rows = 200
			for id := range int64(rows) {
				if err := insertOwn(ctx, n, w, table, id, tagged); err != nil {
					t.Fatal(err)
				}
				if !n.loader.MayContain(id) {
					t.Fatalf("%d reads absent right after its Insert", id)
				}
			}
			if checked, wrong := n.wrong404s(t, parseInt64); wrong != 0 || checked != rows {
				t.Fatalf("%d wrong 404s of %d keys, want 0 of %d", wrong, checked, rows)
			}
			n.waitApplied(t)
			copies := n.loader.Guard().Len() - rows
			exec(t, c, "DELETE FROM `"+table+"`")
			n.waitApplied(t)
			present := 0
			for id := range int64(rows) {
				if n.loader.MayContain(id) {
					present++
				}
			}
			st := n.follower.Stats()
			t.Logf("tagged=%v: %d rows inserted through the Loader; %d copies in the guard beyond the rows, %d inserts skipped as own; after the rows were deleted, %d of %d keys still read present",
				tagged, rows, copies, st.Skipped, present, rows)
			switch {
			case tagged && (copies != 0 || st.Skipped != rows || present > 2):
				t.Fatalf("tagged: %d extra copies, %d skipped, %d present after the delete; want 0, %d, about 0", copies, st.Skipped, present, rows)
			case !tagged && (copies != rows || st.Skipped != 0 || present != rows):
				t.Fatalf("untagged: %d extra copies, %d skipped, %d present after the delete; want %d, 0, %d", copies, st.Skipped, present, rows, rows)
			}
		})
	}
}

// TestTagRefuses: Tag writes nothing for a key that is not its column's
// one text (under utf8mb4_general_ci, "alice" is "ALICE"), nor for no
// keys.
func TestTagRefuses(t *testing.T) {
	srv := testDSN(t)
	table, _ := newTable(t, srv, "k VARCHAR(40) NOT NULL PRIMARY KEY", "")
	n := startNode(t, srv, table, "k", parseString)
	n.waitCurrent(t)
	if _, err := n.follower.TagStatements("alice"); err == nil || !strings.Contains(err.Error(), `"ALICE"`) {
		t.Fatalf("TagStatements(alice) = %v, want an error that names ALICE", err)
	}
	if _, err := n.follower.TagStatements(); err == nil {
		t.Fatal("TagStatements() = nil error, want one for no keys")
	}
	stmts, err := n.follower.TagStatements("ALICE")
	if err != nil || len(stmts) != 2 {
		t.Fatalf("TagStatements(ALICE) = %d statements, %v; want 2, nil", len(stmts), err)
	}
	var x execRecorder
	if err := n.follower.Tag(context.Background(), &x, "ALICE", "BOB"); err != nil || x.n != 2 {
		t.Fatalf("Tag = %v after %d statements, want nil after 2", err, x.n)
	}
	x.fail = errors.New("down")
	if err := n.follower.Tag(context.Background(), &x, "ALICE"); !errors.Is(err, x.fail) {
		t.Fatalf("Tag through a failing Tx = %v, want its error", err)
	}
}

type execRecorder struct {
	n    int
	fail error
}

func (x *execRecorder) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	x.n++
	return nil, x.fail
}

// TestOwnInsertsUnderChurn: this process inserts keys through its Loader,
// tagged, while another connection deletes them again and other writers
// commit, and its stream is killed now and then (each next session
// resumes): a tagged insert of a key whose deletion is held cancels it,
// and no wrong 404 may follow.
func TestOwnInsertsUnderChurn(t *testing.T) {
	srv := testDSN(t)
	table, c := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY, v INT", "")
	const space = 2000
	insertRange(t, c, table, 0, space/2)
	w := startWriters(t, srv, table, 1, space)
	n := startNode(t, srv, table, "id", parseInt64)
	n.waitCurrent(t)
	stop := make(chan struct{})
	var own, dels atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() { // this process's inserts
		conn := connect(t, srv)
		for ctx := context.Background(); ; {
			select {
			case <-stop:
				return
			default:
			}
			if insertOwn(ctx, n, conn, table, rand.Int64N(space), true) == nil {
				own.Add(1)
			}
		}
	})
	wg.Go(func() { // their deletion, soon after
		conn := connect(t, srv)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := conn.Execute(fmt.Sprintf("DELETE FROM `%s` WHERE id = %d", table, rand.Int64N(space))); err == nil {
				dels.Add(1)
			}
		}
	})
	kills := 3
	for range kills {
		time.Sleep(700 * time.Millisecond)
		resumed := n.follower.Stats().Resumes
		killStreams(t, connect(t, srv))
		n.waitResume(t, resumed, time.Now())
	}
	close(stop)
	wg.Wait()
	w.halt()
	checked, wrong := n.wrong404s(t, parseInt64)
	st := n.follower.Stats()
	t.Logf("%d own tagged inserts (%d skipped from the stream), %d deletes, %d other commits; %d kills, %d resumes, %d reads; %d keys checked, %d wrong 404s",
		own.Load(), st.Skipped, dels.Load(), w.commits.Load(), kills, st.Resumes, st.FullReads, checked, wrong)
	if wrong != 0 || checked == 0 {
		t.Fatalf("%d wrong 404s of %d committed keys", wrong, checked)
	}
	if st.Skipped == 0 {
		t.Fatal("no own insert was skipped")
	}
}

// TestKey: Follower.Key gives the column's one text, before the first
// session (through a connection of its own) and after it; a text the form
// cannot judge is an error.
func TestKey(t *testing.T) {
	srv := testDSN(t)
	table, _ := newTable(t, srv, "k VARCHAR(40) NOT NULL PRIMARY KEY", "")
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[string, struct{}](func(context.Context, string) (struct{}, error) { return struct{}{}, nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := NewFollower(l, dsnOf(srv), table, "k", parseString)
	if err != nil {
		t.Fatal(err)
	}
	if k, err := f.Key("alice  "); err != nil || k != "ALICE" {
		t.Fatalf("Key(\"alice  \") before any session = %q, %v; want ALICE", k, err)
	}
	n := startNode(t, srv, table, "k", parseString)
	n.waitCurrent(t)
	for text, want := range map[string]string{"Alice": "ALICE", "alice ": "ALICE", "ALICE": "ALICE", "bob": "BOB"} {
		if k, err := n.follower.Key(text); err != nil || k != want {
			t.Errorf("Key(%q) = %q, %v; want %q", text, k, err, want)
		}
	}
	if _, err := n.follower.Key("\xff"); err == nil {
		t.Error("Key of a text that is not UTF-8: no error")
	}
}
