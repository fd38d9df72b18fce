package postgres

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// streamFixture is a stream decoder over a Loader's feed, without a
// server.
func streamFixture(t *testing.T) (*stream[int64], *guarded.Loader[int64, string]) {
	t.Helper()
	g, err := guard.New(guard.WithCapacity(1 << 16))
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, string](func(context.Context, int64) (string, error) { return "", nil }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	f := &Follower[int64]{key: "id", table: "users", parse: parseID, feed: feed}
	tag := ""
	f.tag.Store(&tag)
	return &stream[int64]{f: f, schema: "public", rel: "users", keyCol: 0, relID: 7}, l
}

func tuple(id int64) *pglogrepl.TupleData {
	return &pglogrepl.TupleData{Columns: []*pglogrepl.TupleDataColumn{{DataType: pglogrepl.TupleDataTypeText, Data: []byte(strconv.FormatInt(id, 10))}}}
}

// TestStreamHoldsDeletesUntilCommit: a session that ends within a
// transaction has applied its creations and none of its deletes, so that
// the next session, which replays the whole transaction from the last
// commit, applies each delete once. Applied at once, a delete would be
// applied twice and take the copy of another key.
func TestStreamHoldsDeletesUntilCommit(t *testing.T) {
	st, l := streamFixture(t)
	if err := st.f.feed.Apply(guarded.Change[int64]{Key: 1}); err != nil { // read by the session's read
		t.Fatal(err)
	}
	tx := []pglogrepl.Message{
		&pglogrepl.BeginMessage{},
		&pglogrepl.DeleteMessage{RelationID: 7, OldTuple: tuple(1)},
		&pglogrepl.InsertMessage{RelationID: 7, Tuple: tuple(2)},
	}
	for _, m := range tx { // the session ends before the Commit
		if err := st.message(m, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.Guard().Len(); n != 2 {
		t.Fatalf("%d copies after a transaction cut before its commit, want 2 (the delete held back, the insert applied)", n)
	}
	replay, _ := streamFixture(t)
	replay.f = st.f // the next session, on the same Loader
	for _, m := range append(tx, &pglogrepl.CommitMessage{TransactionEndLSN: 100}) {
		if err := replay.message(m, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if !l.MayContain(2) || l.Guard().Len() != 2 {
		t.Fatalf("after the replay: %d copies, want 2: the insert twice (one extra copy), the delete once", l.Guard().Len())
	}
	if st.f.pos.applied != 100 {
		t.Fatalf("applied position %s after the commit, want 0/64", st.f.pos.applied)
	}
}

// TestStreamBigDeleteTransaction: a transaction that deletes more keys
// than a session holds back is not held back at all, and ends the session
// at its commit, so that the next one reads the table: bounded memory,
// and never a delete applied twice.
func TestStreamBigDeleteTransaction(t *testing.T) {
	st, _ := streamFixture(t)
	if err := st.message(&pglogrepl.BeginMessage{}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for id := range int64(maxTxDeletes + 10) {
		if err := st.message(&pglogrepl.DeleteMessage{RelationID: 7, OldTuple: tuple(id)}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if len(st.deletes) != 0 || !st.overflow {
		t.Fatalf("%d deletes held back, overflow %v; want none, true", len(st.deletes), st.overflow)
	}
	if err := st.message(&pglogrepl.CommitMessage{TransactionEndLSN: 200}, time.Now()); !errors.Is(err, errBigTransaction) {
		t.Fatalf("commit of the big transaction = %v, want errBigTransaction", err)
	}
}
