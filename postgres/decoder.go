package postgres

import (
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
)

// Prefixes of the logical decoding messages a Follower sends itself.
const (
	originPrefix  = "cuckooguard.origin" // Tag: keys this transaction adds, and who added them
	controlPrefix = "cuckooguard.hb"     // markers and heartbeats; a relayed follower's carry a suffix (Source)
)

// maxTxKeys is the most keys a decoder holds back for one transaction (16
// bytes and more each): a transaction's creations are held until its
// commit, so that a tag written after its insert still names it, and its
// deletions too, so that a replay applies each once (see txn). Beyond it
// creations are passed on at once, and deletions dropped: the transaction
// is marked overflow, and its follower reads the table after it.
const maxTxKeys = 1 << 20

// A txn is one committed transaction, as pgoutput carries it: what it
// did to each followed table, its tags, and its control messages.
//
// Its changes are applied at its commit, creations first. A session that
// ends within a transaction has applied none of it; the next one replays
// it whole from the last commit applied. (Deletions applied as they came
// would be applied twice by the replay, and the second removal could take
// the copy of another key; creations first, so that a key created and
// deleted in one transaction is never removed before it is added.)
type txn struct {
	end      pglogrepl.LSN // the end of its commit record: a resume after it starts there
	xid      uint32        // its transaction id
	tables   []tableTxn    // per followed table, in the decoder's order
	tags     [][]byte      // the contents of its tags (originPrefix messages), in stream order
	spilled  bool          // creates were passed on before the commit (more than maxTxKeys held)
	overflow bool          // it deleted more keys than held back: some table's deletes are incomplete
}

// tableTxn is what a transaction did to one table.
type tableTxn struct {
	creates   []string // keys inserted, and new keys of key updates, as text, in stream order
	deletes   []string // keys deleted, and old keys of key updates
	truncated bool     // it truncated the table
}

// touched reports whether the transaction changed the table.
func (t *tableTxn) touched() bool { return len(t.creates) > 0 || len(t.deletes) > 0 || t.truncated }

// A txnSink takes what a decoder decodes: committed transactions,
// creations passed on early, and control messages (markers and
// heartbeats, whose prefix begins with controlPrefix).
type txnSink interface {
	commit(t *txn) error
	spill(table int, creates []string) error
	control(prefix, payload string) error
}

// decoder turns one session's pgoutput messages (proto_version 1, with
// messages) into transactions of the followed tables' keys, as text in the
// canonical form of each key column's type (keys.go). It knows nothing of
// the guard, or which process wrote what: a Follower applies what it decodes (applier), and a Source passes
// it on. It needs no server, and is tested without one.
type decoder struct {
	tables []decodedTable
	limit  int  // maxTxKeys, smaller in tests
	open   bool // between a Begin and its Commit
	tx     txn
}

// decodedTable is a followed table of a decoder.
type decodedTable struct {
	schema, rel, key string
	rule             *keyRule // the key's forms: keys leave in canonical form; nil: as printed
	relID            uint32   // its relation id in this stream; 0 until its Relation message
	keyCols          []int    // the key columns' indexes in its tuples, in the key's order (Columns)
}

// newDecoder returns a decoder of the tables; each is a relation and its
// key column.
func newDecoder(tables ...decodedTable) *decoder {
	d := &decoder{limit: maxTxKeys, tables: tables}
	d.tx.tables = make([]tableTxn, len(tables))
	return d
}

// decode decodes the pgoutput message in wal (an XLogData's payload).
func (d *decoder) decode(wal []byte, sink txnSink) error {
	m, err := pglogrepl.Parse(wal)
	if err != nil {
		return fmt.Errorf("postgres: decode pgoutput: %w", err)
	}
	return d.message(m, sink)
}

// table returns the index of the followed table of relation id rel, or -1.
func (d *decoder) table(rel uint32) int {
	for i := range d.tables {
		if d.tables[i].relID == rel && rel != 0 {
			return i
		}
	}
	return -1
}

// message decodes one pgoutput message.
func (d *decoder) message(m pglogrepl.Message, sink txnSink) error {
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		for i := range d.tables {
			t := &d.tables[i]
			if m.Namespace != t.schema || m.RelationName != t.rel {
				continue
			}
			t.relID, t.keyCols = m.RelationID, t.keyCols[:0]
			for _, key := range columnsOf(t.key) {
				j := slices.IndexFunc(m.Columns, func(c *pglogrepl.RelationMessageColumn) bool { return c.Name == key })
				if j < 0 {
					return fmt.Errorf("%w: the stream of table %s.%s has no column %s", ErrNotPublished, t.schema, t.rel, key)
				}
				t.keyCols = append(t.keyCols, j)
			}
		}
	case *pglogrepl.BeginMessage:
		d.open = true
		for i := range d.tx.tables {
			tt := &d.tx.tables[i]
			*tt = tableTxn{creates: tt.creates[:0], deletes: tt.deletes[:0]}
		}
		d.tx = txn{xid: m.Xid, tables: d.tx.tables, tags: d.tx.tags[:0]}
	case *pglogrepl.LogicalDecodingMessage:
		switch {
		case m.Prefix == originPrefix:
			d.tx.tags = append(d.tx.tags, append([]byte(nil), m.Content...))
		case strings.HasPrefix(m.Prefix, controlPrefix):
			return sink.control(m.Prefix, string(m.Content))
		}
	case *pglogrepl.InsertMessage:
		if i := d.table(m.RelationID); i >= 0 {
			return d.create(i, m.Tuple, sink)
		}
	case *pglogrepl.UpdateMessage:
		// Without an old tuple the key did not change: a publication of
		// the key column alone sends it only then.
		i := d.table(m.RelationID)
		if i < 0 || m.OldTuple == nil {
			return nil
		}
		if err := d.delete(i, m.OldTuple, sink); err != nil {
			return err
		}
		return d.create(i, m.NewTuple, sink)
	case *pglogrepl.DeleteMessage:
		if i := d.table(m.RelationID); i >= 0 {
			return d.delete(i, m.OldTuple, sink)
		}
	case *pglogrepl.TruncateMessage:
		for _, id := range m.RelationIDs {
			if i := d.table(id); i >= 0 {
				d.tx.tables[i].truncated = true
			}
		}
	case *pglogrepl.CommitMessage:
		d.open = false
		d.tx.end = m.TransactionEndLSN
		err := sink.commit(&d.tx)
		big := false
		for i := range d.tx.tables {
			big = big || cap(d.tx.tables[i].creates)+cap(d.tx.tables[i].deletes) > 4096
		}
		if big { // a big transaction's buffers go with it
			d.tx = txn{tables: make([]tableTxn, len(d.tables))}
		}
		return err
	}
	return nil
}

// keyOf returns the text of the key of tuple of table i, in canonical
// form.
func (d *decoder) keyOf(i int, tuple *pglogrepl.TupleData) (string, error) {
	t := &d.tables[i]
	var one [1][]byte
	raw := one[:0]
	if len(t.keyCols) > 1 {
		raw = make([][]byte, 0, len(t.keyCols))
	}
	for _, j := range t.keyCols {
		if tuple == nil || j >= len(tuple.Columns) || tuple.Columns[j].DataType != pglogrepl.TupleDataTypeText {
			// A NULL too: a replica identity's columns are NOT NULL.
			return "", fmt.Errorf("postgres: a change of table %s.%s without its key", t.schema, t.rel)
		}
		raw = append(raw, tuple.Columns[j].Data)
	}
	if len(raw) == 0 {
		return "", fmt.Errorf("postgres: a change of table %s.%s without its key", t.schema, t.rel)
	}
	s, _, err := keyText(t.rule, raw)
	return s, err
}

// held is how many keys the open transaction holds back.
func (d *decoder) held() int {
	n := 0
	for i := range d.tx.tables {
		n += len(d.tx.tables[i].creates) + len(d.tx.tables[i].deletes)
	}
	return n
}

// spillCreates passes on the held creations of every table: applied now
// rather than at the commit, a tag that comes later does not cover them
// (an extra copy each, never a missing one).
func (d *decoder) spillCreates(sink txnSink) error {
	for i := range d.tx.tables {
		tt := &d.tx.tables[i]
		if len(tt.creates) == 0 {
			continue
		}
		d.tx.spilled = true
		if err := sink.spill(i, tt.creates); err != nil {
			return err
		}
		tt.creates = tt.creates[:0]
	}
	return nil
}

func (d *decoder) create(i int, tuple *pglogrepl.TupleData, sink txnSink) error {
	k, err := d.keyOf(i, tuple)
	if err != nil {
		return err
	}
	d.tx.tables[i].creates = append(d.tx.tables[i].creates, k)
	if d.held() >= d.limit {
		return d.spillCreates(sink)
	}
	return nil
}

func (d *decoder) delete(i int, tuple *pglogrepl.TupleData, sink txnSink) error {
	k, err := d.keyOf(i, tuple)
	if err != nil {
		return err
	}
	tt := &d.tx.tables[i]
	switch {
	case d.tx.overflow:
	case d.held() >= d.limit:
		// Make room: creations can be passed on early, deletions not.
		if err := d.spillCreates(sink); err != nil {
			return err
		}
		if d.held() < d.limit {
			tt.deletes = append(tt.deletes, k)
			return nil
		}
		for j := range d.tx.tables {
			d.tx.tables[j].deletes = nil
		}
		d.tx.overflow = true
	default:
		tt.deletes = append(tt.deletes, k)
	}
	return nil
}
