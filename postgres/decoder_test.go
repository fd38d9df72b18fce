package postgres

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guarded"
	"github.com/cuckooguard/cuckooguard/internal/tagrec"
)

// The tests in this file decode pgoutput without a server.

// recorder is a txnSink that keeps what it is given.
type recorder struct {
	txns     []txn
	spills   [][]string
	controls []string
}

func (r *recorder) commit(t *txn) error {
	c := *t
	c.tables = nil
	for _, tt := range t.tables {
		c.tables = append(c.tables, tableTxn{creates: append([]string(nil), tt.creates...), deletes: append([]string(nil), tt.deletes...), truncated: tt.truncated})
	}
	c.tags = append([][]byte(nil), t.tags...)
	r.txns = append(r.txns, c)
	return nil
}
func (r *recorder) spill(_ int, creates []string) error {
	r.spills = append(r.spills, append([]string(nil), creates...))
	return nil
}
func (r *recorder) control(prefix, payload string) error {
	r.controls = append(r.controls, prefix+" "+payload)
	return nil
}

// users is the tests' followed table.
func users(schema string) decodedTable { return decodedTable{schema: schema, rel: "users", key: "id"} }

// pgoutput builds the bytes of pgoutput messages (protocol version 1), as
// the server sends them in XLogData.
type pgoutput struct{ b []byte }

func (p *pgoutput) u8(v byte) *pgoutput    { p.b = append(p.b, v); return p }
func (p *pgoutput) u16(v uint16) *pgoutput { p.b = binary.BigEndian.AppendUint16(p.b, v); return p }
func (p *pgoutput) u32(v uint32) *pgoutput { p.b = binary.BigEndian.AppendUint32(p.b, v); return p }
func (p *pgoutput) u64(v uint64) *pgoutput { p.b = binary.BigEndian.AppendUint64(p.b, v); return p }
func (p *pgoutput) str(s string) *pgoutput { p.b = append(append(p.b, s...), 0); return p }

func begin(xid uint32) []byte {
	return (&pgoutput{}).u8('B').u64(0x100).u64(0).u32(xid).b
}

func commit(end uint64) []byte {
	return (&pgoutput{}).u8('C').u8(0).u64(end - 8).u64(end).u64(0).b
}

func relationMsg(id uint32, schema, name string, cols ...string) []byte {
	p := (&pgoutput{}).u8('R').u32(id).str(schema).str(name).u8('d').u16(uint16(len(cols)))
	for _, c := range cols {
		p.u8(1).str(c).u32(20).u32(0xffffffff)
	}
	return p.b
}

// tupleOf appends a tuple of the columns of the tests' relation 7
// (name, id) with key as its id, or of one column, the key, for any
// other relation.
func tupleOf(p *pgoutput, rel uint32, key string) {
	if rel == 7 {
		p.u16(2).u8('n')
	} else {
		p.u16(1)
	}
	p.u8('t').u32(uint32(len(key)))
	p.b = append(p.b, key...)
}

func insertMsg(rel uint32, key string) []byte {
	p := (&pgoutput{}).u8('I').u32(rel).u8('N')
	tupleOf(p, rel, key)
	return p.b
}

func deleteMsg(rel uint32, key string) []byte {
	p := (&pgoutput{}).u8('D').u32(rel).u8('K')
	tupleOf(p, rel, key)
	return p.b
}

func updateMsg(rel uint32, old, key string) []byte {
	p := (&pgoutput{}).u8('U').u32(rel).u8('K')
	tupleOf(p, rel, old)
	p.u8('N')
	tupleOf(p, rel, key)
	return p.b
}

func truncateMsg(rels ...uint32) []byte {
	p := (&pgoutput{}).u8('T').u32(uint32(len(rels))).u8(0)
	for _, r := range rels {
		p.u32(r)
	}
	return p.b
}

func messageMsg(prefix string, content []byte) []byte {
	p := (&pgoutput{}).u8('M').u8(1).u64(0x200).str(prefix).u32(uint32(len(content)))
	p.b = append(p.b, content...)
	return p.b
}

// feed decodes each of msgs into sink, failing the test on an error.
func feed(t *testing.T, d *decoder, sink txnSink, msgs ...[]byte) {
	t.Helper()
	for _, m := range msgs {
		if err := d.decode(m, sink); err != nil {
			t.Fatalf("decode %q: %v", m[0], err)
		}
	}
}

// TestDecoderTransactions decodes the bytes of a session's stream: the
// table's relation among another table's, inserts, a key update, an
// update that keeps its key, deletes, tags, a control message, and a
// TRUNCATE of the table and of another.
func TestDecoderTransactions(t *testing.T) {
	d := newDecoder(users("app"))
	r := &recorder{}
	buf := messageMsg(originPrefix, []byte("tag"))
	feed(t, d, r,
		relationMsg(9, "app", "other", "id"),
		relationMsg(7, "app", "users", "name", "id"),
		begin(1),
		insertMsg(7, "1"), insertMsg(9, "99"), buf,
		updateMsg(7, "1", "2"),
		(&pgoutput{}).u8('U').u32(7).u8('N').u16(2).u8('n').u8('t').u32(1).u8('5').b, // no old tuple: the key stayed
		deleteMsg(7, "3"), deleteMsg(9, "98"),
		messageMsg(controlPrefix, []byte("H x-1 v")),
		commit(0x1000),
		begin(2), truncateMsg(9), commit(0x2000),
		begin(3), truncateMsg(9, 7), commit(0x3000),
	)
	buf[len(buf)-1] = 'X' // the decoder keeps no slice of the wire's buffer
	if len(d.tables[0].keyCols) != 1 || d.tables[0].keyCols[0] != 1 {
		t.Fatalf("key columns %v, want [1] (the second of the relation's columns)", d.tables[0].keyCols)
	}
	if len(r.txns) != 3 || len(r.controls) != 1 || r.controls[0] != controlPrefix+" H x-1 v" {
		t.Fatalf("%d transactions, controls %q", len(r.txns), r.controls)
	}
	tx := r.txns[0]
	if got, want := [3]string{join(tx.tables[0].creates), join(tx.tables[0].deletes), string(tx.tags[0])}, [3]string{"1,2", "1,3", "tag"}; got != want {
		t.Fatalf("creates, deletes, tag = %q, want %q", got, want)
	}
	if tx.end != 0x1000 || tx.xid != 1 || tx.tables[0].truncated || r.txns[1].tables[0].truncated || !r.txns[2].tables[0].truncated {
		t.Fatalf("end %s, xid %d, truncated %v %v %v", tx.end, tx.xid, tx.tables[0].truncated, r.txns[1].tables[0].truncated, r.txns[2].tables[0].truncated)
	}
	// A relation of the table without the key column: not published.
	err := d.decode(relationMsg(7, "app", "users", "name"), r)
	if !errors.Is(err, ErrNotPublished) {
		t.Fatalf("relation without the key = %v, want ErrNotPublished", err)
	}
}

func join(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += ","
		}
		out += s
	}
	return out
}

// TestDecoderBigTransaction: a transaction that holds more keys than the
// limit passes its creations on early and drops its deletions, marked
// overflow: bounded memory, never a delete applied twice.
func TestDecoderBigTransaction(t *testing.T) {
	d := newDecoder(users("app"))
	d.limit = 10
	r := &recorder{}
	feed(t, d, r, relationMsg(7, "app", "users", "name", "id"), begin(1))
	for i := range 25 {
		feed(t, d, r, insertMsg(7, strconv.Itoa(i)))
	}
	if len(r.spills) != 2 || len(d.tx.tables[0].creates) != 5 {
		t.Fatalf("%d spills, %d creates held; want 2 of 10, 5 held", len(r.spills), len(d.tx.tables[0].creates))
	}
	for i := range 11 { // 5 creates and 5 deletes held: the creates go; 10 deletes held; then one too many
		feed(t, d, r, deleteMsg(7, strconv.Itoa(i)))
	}
	feed(t, d, r, commit(0x100))
	tx := r.txns[0]
	if len(r.spills) != 3 || len(tx.tables[0].creates) != 0 || !tx.spilled || !tx.overflow || len(tx.tables[0].deletes) != 0 {
		t.Fatalf("spills %d, creates %d, spilled %v, overflow %v, deletes %d; want 3, 0, true, true, 0",
			len(r.spills), len(tx.tables[0].creates), tx.spilled, tx.overflow, len(tx.tables[0].deletes))
	}
}

// applierFixture is an applier over a Loader's feed, without a server.
func applierFixture(t *testing.T) (*applier[int64], *guarded.Loader[int64, string]) {
	t.Helper()
	l := emptyLoaderOf[int64](t)
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	tags, err := newTagger("A", parseID, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &Follower[int64]{key: "id", table: "users", parse: parseID, feed: feed, tags: tags}
	a := &applier[int64]{f: f, now: time.Now()}
	// A heartbeat whose snapshot sees every transaction of these tests
	// has been checked: their deletions are applied at their commits.
	a.s = sessionSeeing(Snapshot{Xmin: 1 << 20, Xmax: 1 << 20})
	a.released = a.s.walsender.Load()
	return a, l
}

// sessionSeeing is a session whose last heartbeat ran under snap.
func sessionSeeing(snap Snapshot) *session {
	var probe atomic.Pointer[walsender]
	probe.Store(&walsender{snap: snap})
	return &session{walsender: &probe}
}

// TestApplierRecreatedKeyCancelsHeldDeletion: a key deleted and created
// again and again while the deletions wait for a heartbeat (by other
// writers, and by this process's own tagged inserts, whose copies the
// Loader added) keeps one copy, not one per creation: the guard takes at
// most guard.MaxCopies, and the held deletions, applied later, would take
// the last copy of a live key (a wrong 404).
func TestApplierRecreatedKeyCancelsHeldDeletion(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprintf("own=%v", own), func(t *testing.T) {
			a, l := applierFixture(t)
			l.MarkReady()
			if err := a.f.feed.Apply(guarded.Change[int64]{Key: 1}); err != nil { // read by the session's read
				t.Fatal(err)
			}
			a.s = sessionSeeing(Snapshot{Xmin: 5, Xmax: 5}) // every xid from 5 on in progress
			a.released = a.s.walsender.Load()
			d := newDecoder(users("public"))
			feed(t, d, a, relationMsg(7, "public", "users", "name", "id"))
			xid := uint32(5)
			for i := range 10 {
				feed(t, d, a, begin(xid), deleteMsg(7, "1"), commit(uint64(0x100+2*i)))
				xid++
				if own {
					// Loader.Insert adds its copy before it writes; the
					// stream then brings the tagged insert.
					if err := a.f.feed.Apply(guarded.Change[int64]{Key: 1}); err != nil {
						t.Fatal(err)
					}
					feed(t, d, a, begin(xid), messageMsg(originPrefix, tagrec.AppendField(tagrec.AppendField(nil, a.f.tags.Run()), "1")), insertMsg(7, "1"), commit(uint64(0x101+2*i)))
				} else {
					feed(t, d, a, begin(xid), insertMsg(7, "1"), commit(uint64(0x101+2*i)))
				}
				xid++
			}
			if !l.MayContain(1) {
				t.Fatal("key 1 reads absent while its deletions are held")
			}
			later := &applier[int64]{f: a.f, now: time.Now(), s: sessionSeeing(Snapshot{Xmin: 100, Xmax: 100})}
			if err := later.release(); err != nil {
				t.Fatal(err)
			}
			if !l.MayContain(1) || l.Guard().Len() != 1 || len(a.f.held) != 0 || len(a.f.heldKeys) != 0 || len(a.f.cancelled) != 0 {
				t.Fatalf("after 10 deletions and creations of key 1, all visible: present %v, %d copies, %d held, %v %v; want present, 1 copy, none held",
					l.MayContain(1), l.Guard().Len(), len(a.f.held), a.f.heldKeys, a.f.cancelled)
			}
		})
	}
}

// TestOwnInsertsAheadOfTheStream: this process deletes a key and inserts
// it again through its Loader six times before the stream brings the
// first of those transactions (a loop faster than the stream's few
// milliseconds). Each Loader.Insert adds a copy before it writes; past
// guard.MaxCopies the guard takes no more, while the stream skips every
// tagged insert as added and applies every deletion: before the Loader
// owed the refused copies (guarded's view.over), the key's copies ran out
// while its row existed (0 copies here).
func TestOwnInsertsAheadOfTheStream(t *testing.T) {
	a, l := applierFixture(t)
	l.MarkReady()
	d := newDecoder(users("public"))
	msgs := [][]byte{relationMsg(7, "public", "users", "name", "id")}
	xid := uint32(5)
	for i := range 6 {
		if err := a.f.feed.Apply(guarded.Change[int64]{Key: 1}); err != nil { // Loader.Insert's copy, before the stream has anything
			t.Fatal(err)
		}
		msgs = append(msgs, begin(xid), messageMsg(originPrefix, tagrec.AppendField(tagrec.AppendField(nil, a.f.tags.Run()), "1")), insertMsg(7, "1"), commit(uint64(0x100+2*i)))
		xid++
		if i < 5 {
			msgs = append(msgs, begin(xid), deleteMsg(7, "1"), commit(uint64(0x101+2*i)))
			xid++
		}
	}
	feed(t, d, a, msgs...)
	if err := (&applier[int64]{f: a.f, now: time.Now(), s: sessionSeeing(Snapshot{Xmin: 100, Xmax: 100})}).release(); err != nil {
		t.Fatal(err)
	}
	if !l.MayContain(1) {
		t.Fatalf("key 1, inserted last, reads absent (%d copies)", l.Guard().Len())
	}
}

// TestApplierHoldsDeletionsUntilVisible: a transaction's deletions wait
// for a heartbeat whose snapshot sees it (the stream carries a commit
// before the server makes it visible; TestChurnWrong404), in the session
// that decoded it or a later one, while its creations are applied at its
// commit; a full read drops what is held.
func TestApplierHoldsDeletionsUntilVisible(t *testing.T) {
	a, l := applierFixture(t)
	l.MarkReady()
	for _, k := range []int64{1, 2} {
		if err := a.f.feed.Apply(guarded.Change[int64]{Key: k}); err != nil { // read by the session's read
			t.Fatal(err)
		}
	}
	// xid 5 in progress, as the last heartbeat saw it.
	a.s = sessionSeeing(Snapshot{Xmin: 5, Xmax: 6, Xip: []uint64{5}})
	a.released = a.s.walsender.Load()
	d := newDecoder(users("public"))
	feed(t, d, a, relationMsg(7, "public", "users", "name", "id"), begin(5), deleteMsg(7, "1"), insertMsg(7, "3"), commit(0x10))
	if err := a.release(); err != nil {
		t.Fatal(err)
	}
	if !l.MayContain(1) || !l.MayContain(3) {
		t.Fatalf("key 1 (deleted by an invisible transaction) %v, key 3 (created by it) %v: want both present", l.MayContain(1), l.MayContain(3))
	}
	// The session ends; the next one's first heartbeat sees xid 5.
	next := &applier[int64]{f: a.f, now: time.Now(), s: sessionSeeing(Snapshot{Xmin: 7, Xmax: 7})}
	if err := next.release(); err != nil {
		t.Fatal(err)
	}
	if l.MayContain(1) || !l.MayContain(2) || !l.MayContain(3) || len(a.f.held) != 0 {
		t.Fatalf("after a heartbeat that sees it: keys 1, 2, 3 = %v %v %v, %d held; want false true true, 0",
			l.MayContain(1), l.MayContain(2), l.MayContain(3), len(a.f.held))
	}
	// Held again, then a full read: dropped, not applied to the new guard.
	d = newDecoder(users("public"))
	feed(t, d, next, relationMsg(7, "public", "users", "name", "id"), begin(9), deleteMsg(7, "2"), commit(0x20))
	if len(a.f.held) != 1 {
		t.Fatalf("%d transactions held, want 1", len(a.f.held))
	}
	a.f.dropHeld()
	later := &applier[int64]{f: a.f, now: time.Now(), s: sessionSeeing(Snapshot{Xmin: 10, Xmax: 10})}
	if err := later.release(); err != nil {
		t.Fatal(err)
	}
	if !l.MayContain(2) {
		t.Fatal("a deletion dropped by a full read was applied")
	}
}

// TestApplierHoldsChangesUntilCommit: a session that ends within a
// transaction has applied none of it, so that the next session, which
// replays the whole transaction from the last commit, applies each
// change once. A delete applied twice would take the copy of another key.
func TestApplierHoldsChangesUntilCommit(t *testing.T) {
	a, l := applierFixture(t)
	if err := a.f.feed.Apply(guarded.Change[int64]{Key: 1}); err != nil { // read by the session's read
		t.Fatal(err)
	}
	tx := [][]byte{relationMsg(7, "public", "users", "name", "id"), begin(1), deleteMsg(7, "1"), insertMsg(7, "2")}
	d := newDecoder(users("public"))
	feed(t, d, a, tx...) // the session ends before the commit
	if n := l.Guard().Len(); n != 1 {
		t.Fatalf("%d copies after a transaction cut before its commit, want 1: nothing of it applied", n)
	}
	replay := newDecoder(users("public"))
	feed(t, replay, a, append(tx, commit(100))...)
	if !l.MayContain(2) || l.Guard().Len() != 1 {
		t.Fatalf("after the replay: %d copies, want 1 (key 2)", l.Guard().Len())
	}
	if a.f.pos.applied != 100 {
		t.Fatalf("applied position %s after the commit, want 0/64", a.f.pos.applied)
	}
}

// TestApplierSkipsTaggedKeysOnly is case 4 of the follower issue: a
// transaction that this run tagged for key 7000 also inserts 7001 (and,
// in another, a tag written after its insert, and a key tagged once but
// inserted twice). Only the tagged keys are skipped, once each; another
// run's tag skips nothing.
func TestApplierSkipsTaggedKeysOnly(t *testing.T) {
	a, l := applierFixture(t)
	run := a.f.tags.Run()
	tag := func(run string, keys ...int64) []byte {
		var b []byte
		for _, k := range keys {
			b = tagrec.AppendField(tagrec.AppendField(b, run), strconv.FormatInt(k, 10))
		}
		return messageMsg(originPrefix, b)
	}
	for _, k := range []int64{7000, 8000, 9000} { // this process's Loader added them
		if err := a.f.feed.Apply(guarded.Change[int64]{Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	d := newDecoder(users("public"))
	feed(t, d, a, relationMsg(7, "public", "users", "name", "id"),
		begin(1), tag(run, 7000), insertMsg(7, "7000"), insertMsg(7, "7001"), commit(0x10),
		begin(2), insertMsg(7, "8000"), tag(run, 8000), commit(0x20),
		begin(3), tag(run, 9000), insertMsg(7, "9000"), deleteMsg(7, "9000"), insertMsg(7, "9000"), commit(0x30),
		begin(4), tag("A 0", 9500), insertMsg(7, "9500"), commit(0x40),
	)
	l.MarkReady()
	for _, k := range []int64{7000, 7001, 8000, 9000, 9500} {
		if !l.MayContain(k) {
			t.Errorf("key %d reads absent", k)
		}
	}
	if n := l.Guard().Len(); n != 5 {
		t.Errorf("%d copies for 5 rows: a tagged insert was applied, or an untagged one skipped", n)
	}
	if got := a.f.skipped.Load(); got != 3 {
		t.Fatalf("%d inserts skipped, want 3 (7000, 8000, and 9000 once)", got)
	}
}

// TestDecoderTables decodes one stream of two followed tables and one
// other: each transaction says what it did to each, and a control
// message with a suffix (a relayed follower's) keeps its prefix.
func TestDecoderTables(t *testing.T) {
	d := newDecoder(users("app"), decodedTable{schema: "app", rel: "orders", key: "no"})
	r := &recorder{}
	feed(t, d, r,
		relationMsg(7, "app", "users", "name", "id"),
		relationMsg(8, "app", "orders", "no"),
		relationMsg(9, "app", "other", "id"),
		begin(1), insertMsg(7, "1"), insertMsg(8, "1"), insertMsg(9, "1"), deleteMsg(8, "2"),
		messageMsg(controlPrefix+"/app.orders", []byte("H y-1 v")), commit(0x100),
		begin(2), truncateMsg(8), commit(0x200),
	)
	if len(r.txns) != 2 || len(r.controls) != 1 || r.controls[0] != controlPrefix+"/app.orders H y-1 v" {
		t.Fatalf("%d transactions, controls %q", len(r.txns), r.controls)
	}
	u, o := r.txns[0].tables[0], r.txns[0].tables[1]
	if join(u.creates) != "1" || len(u.deletes) != 0 || join(o.creates) != "1" || join(o.deletes) != "2" {
		t.Fatalf("users %+v, orders %+v", u, o)
	}
	if r.txns[1].tables[0].touched() || !r.txns[1].tables[1].truncated {
		t.Fatalf("second transaction: %+v", r.txns[1].tables)
	}
}
