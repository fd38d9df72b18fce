package postgres

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// Follow-on: after a start from the snapshot file, a lost connection
// resumes; it does not restore the file again.
func TestResumeAfterRestartFromFile(t *testing.T) {
	dsn := setupUsers(t, 1000)
	file := filepath.Join(t.TempDir(), "users.guard")
	conf := nodeConf{opts: []Option{WithSnapshotFile(file)}}
	a := startNode(t, dsn, "users", "id", "A", parseInt64, conf)
	a.halt()
	b := startNode(t, dsn, "users", "id", "A", parseInt64, conf)
	execAll(t, dsn, fmt.Sprintf(`SELECT pg_terminate_backend(%d)`, b.follower.Stats().BackendPID))
	insertRange(t, dsn, 20000, 20100)
	for b.follower.Stats().Failures == 0 {
		time.Sleep(time.Millisecond)
	}
	expectNoWrong404s(t, b, "after a lost connection")
	if st := b.follower.Stats(); st.SnapshotStart != 1 || st.Resyncs != 0 {
		t.Fatalf("after a lost connection: %d starts from the file and %d full reads, want 1 and 0 (a resume)", st.SnapshotStart, st.Resyncs)
	}
}

// Follow-on: a publication dropped and made again; the running replica
// must read the table (the old slot's decoding cannot see the new
// publication), not fail every resume.
func TestPublicationRemade(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 1000)
	a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{})
	execAll(t, dsn, `DROP PUBLICATION `+publication(t, dsn))
	insertRange(t, dsn, 10000, 10100)
	if err := Publish(ctx, connect(t, dsn), "users", "id"); err != nil {
		t.Fatal(err)
	}
	insertRange(t, dsn, 20000, 20100)
	expectNoWrong404s(t, a, "after the publication was made again")
}

// Follow-on: after a full read into a new slot, the follower must not
// confirm the position of a snapshot file written for the slot before it
// (PostgreSQL 15 ignores a confirmation below the slot's, but the slot
// and the file must never disagree). The file's directory goes away after
// the restart, so that no new file can be written: the position of the
// restored file is the last one saved.
func TestConfirmsOnlyItsSlotsFile(t *testing.T) {
	ctx := context.Background()
	dsn := setupUsers(t, 1000)
	dir := t.TempDir()
	file := filepath.Join(dir, "snap", "users.guard")
	if err := os.Mkdir(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := nodeConf{opts: []Option{WithSnapshotFile(file)}}
	a := startNode(t, dsn, "users", "id", "A", parseInt64, conf)
	insertRange(t, dsn, 2000, 2100)
	a.waitCurrent(t)
	a.halt()
	b := startNode(t, dsn, "users", "id", "A", parseInt64, conf)
	if st := b.follower.Stats(); st.SnapshotStart != 1 {
		t.Fatalf("the restart did not start from the file: %+v", st)
	}
	if err := os.RemoveAll(filepath.Dir(file)); err != nil {
		t.Fatal(err)
	}
	var before string
	if err := connect(t, dsn).QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	low, err := pglogrepl.ParseLSN(before)
	if err != nil {
		t.Fatal(err)
	}
	execAll(t, dsn, `TRUNCATE users`, `INSERT INTO users SELECT g, 'after' FROM generate_series(1, 100) g`)
	for b.follower.Stats().FullReads[ReadTruncated] == 0 {
		time.Sleep(time.Millisecond)
	}
	expectNoWrong404s(t, b, "after the full read")
	time.Sleep(5 * hb) // a few confirmations
	if lsn := b.follower.Stats().ConfirmedLSN; lsn < low {
		t.Errorf("confirmed %s after the full read, a position from before the new slot existed (made after %s)", lsn, low)
	}
}

// Follow-on: the snapshot file names its cluster and database: a file of
// another cluster, whose LSNs mean nothing here, is not restored, even
// with a slot of the same name at a position below the file's.
func TestSnapshotFileOfAnotherCluster(t *testing.T) {
	dsn := setupUsers(t, 1000)
	file := filepath.Join(t.TempDir(), "users.guard")
	conf := nodeConf{opts: []Option{WithSnapshotFile(file)}}
	a := startNode(t, dsn, "users", "id", "A", parseInt64, conf)
	a.halt()
	for _, tc := range []struct {
		name  string
		alter func(h *snapFile)
	}{
		{"another cluster", func(h *snapFile) { h.slot.system = "1" + h.slot.system }},
		{"another database", func(h *snapFile) { h.slot.database += "_copy" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, g, err := readSnapshotFile(file)
			if err != nil {
				t.Fatal(err)
			}
			orig := h
			tc.alter(&h)
			if _, err := writeSnapshotFile(file, h, g); err != nil {
				t.Fatal(err)
			}
			g.Close()
			b := startNode(t, dsn, "users", "id", "A", parseInt64, conf)
			if st := b.follower.Stats(); st.SnapshotStart != 0 || st.FullReads[ReadBadSnapshot] != 1 {
				t.Fatalf("a file of %s (%+v, this is %+v): %d starts from it, full reads %v; want a full read for snapshot_bad",
					tc.name, h.slot, orig.slot, st.SnapshotStart, st.FullReads)
			}
			expectNoWrong404s(t, b, "after the full read")
			b.halt()
		})
	}
}

// TestPublishNames: tables named as SQL writes them, with quotes, and a
// partitioned table, published through its root: partitions attached
// later, with rows in them, reach the guard (the publication's version
// changes, and the follower reads the table).
func TestPublishNames(t *testing.T) {
	ctx := context.Background()
	db, _ := pgConn(t)
	dsn := dsnOf(t, db)
	execAll(t, dsn, `CREATE TABLE "UserAccounts" (id bigint PRIMARY KEY)`,
		`INSERT INTO "UserAccounts" SELECT generate_series(1, 100)`)
	if err := Publish(ctx, db, `"UserAccounts"`, "id"); err != nil {
		t.Fatalf("Publish of a quoted name: %v", err)
	}
	err := Publish(ctx, db, `"NoSuchTable"`, "id")
	if err == nil || !strings.Contains(err.Error(), `"NoSuchTable" not found`) || !strings.Contains(err.Error(), "search_path") {
		t.Fatalf("Publish of a missing table = %v, want it named, with the search_path", err)
	}
	q := startNode(t, dsn, `"UserAccounts"`, "id", "Q", parseInt64, nodeConf{})
	execAll(t, dsn, `INSERT INTO "UserAccounts" SELECT generate_series(101, 200)`)
	expectNoWrong404s(t, q, "a quoted table name")

	execAll(t, dsn, `CREATE TABLE parted (id bigint PRIMARY KEY, name text) PARTITION BY RANGE (id)`,
		`CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10000)`,
		`CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (10000) TO (20000)`,
		`INSERT INTO parted SELECT g, 'seed' FROM generate_series(1, 19999, 7) g`)
	if err := Publish(ctx, db, "parted", "id"); err != nil {
		t.Fatalf("Publish of a partitioned table: %v", err)
	}
	p := startNode(t, dsn, "parted", "id", "P", parseInt64, nodeConf{})
	execAll(t, dsn, `INSERT INTO parted SELECT g, 'later' FROM generate_series(2, 19999, 7) g`,
		`DELETE FROM parted WHERE id % 3 = 0`,
		`UPDATE parted SET id = 10000 WHERE id = 9997`) // moves the row to another partition
	expectNoWrong404s(t, p, "a partitioned table")
	execAll(t, dsn, `CREATE TABLE parted_3 (id bigint PRIMARY KEY, name text)`,
		`INSERT INTO parted_3 SELECT g, 'attached' FROM generate_series(20000, 20099) g`,
		`ALTER TABLE parted ATTACH PARTITION parted_3 FOR VALUES FROM (20000) TO (30000)`)
	expectNoWrong404s(t, p, "a partition attached with its rows")
	if st := p.follower.Stats(); st.FullReads[ReadPublication] == 0 {
		t.Errorf("no full read after the partition was attached: %v", st.FullReads)
	}
}
