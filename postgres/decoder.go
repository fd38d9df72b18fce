package postgres

import (
	"fmt"

	"github.com/jackc/pglogrepl"
)

// Prefixes of the logical decoding messages a Follower sends itself.
const (
	originPrefix  = "cuckooguard.origin" // Tag: keys this transaction adds, and who added them
	controlPrefix = "cuckooguard.hb"     // markers and heartbeats
)

// maxTxKeys is the most keys a decoder holds back for one transaction (16
// bytes and more each): a transaction's creations are held until its
// commit, so that a tag written after its insert still names it, and its
// deletions too, so that a replay applies each once (see txn). Beyond it
// creations are passed on at once, and deletions dropped: the transaction
// is marked overflow, and its follower reads the table after it.
const maxTxKeys = 1 << 20

// A txn is one committed transaction of the followed table, as pgoutput
// carries it.
//
// Its changes are applied at its commit, creations first. A session that
// ends within a transaction has applied none of it; the next one replays
// it whole from the last commit applied. (Deletions applied as they came
// would be applied twice by the replay, and the second removal could take
// the copy of another key; creations first, so that a key created and
// deleted in one transaction is never removed before it is added.)
type txn struct {
	end       pglogrepl.LSN // the end of its commit record: a resume after it starts there
	creates   []string      // keys inserted, and new keys of key updates, as text, in stream order
	deletes   []string      // keys deleted, and old keys of key updates
	tags      [][]byte      // the contents of its tags (originPrefix messages), in stream order
	truncated bool          // it truncated the table
	spilled   bool          // creates were passed on before the commit (more than maxTxKeys held)
	overflow  bool          // it deleted more keys than held back: deletes is incomplete
}

// A txnSink takes what a decoder decodes: committed transactions of the
// table, creations passed on early, and the control messages (markers and
// heartbeats).
type txnSink interface {
	commit(t *txn) error
	spill(creates []string) error
	control(payload string) error
}

// decoder turns one session's pgoutput messages (proto_version 1, with
// messages) into transactions of the followed table's keys, as text. It
// knows nothing of the key's type, the guard, or which process wrote what:
// a Follower applies what it decodes (applier), and so could a relay that
// publishes it. It needs no server, and is tested without one.
type decoder struct {
	schema, rel, key string // the followed table and key column
	limit            int    // maxTxKeys, smaller in tests
	relID            uint32 // the table's relation id in this stream; 0 until its Relation message
	keyCol           int    // the key column's index in the table's tuples
	open             bool   // between a Begin and its Commit
	tx               txn
}

func newDecoder(schema, rel, key string) *decoder {
	return &decoder{schema: schema, rel: rel, key: key, limit: maxTxKeys, keyCol: -1}
}

// decode decodes the pgoutput message in wal (an XLogData's payload).
func (d *decoder) decode(wal []byte, sink txnSink) error {
	m, err := pglogrepl.Parse(wal)
	if err != nil {
		return fmt.Errorf("postgres: decode pgoutput: %w", err)
	}
	return d.message(m, sink)
}

// message decodes one pgoutput message.
func (d *decoder) message(m pglogrepl.Message, sink txnSink) error {
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		if m.Namespace != d.schema || m.RelationName != d.rel {
			return nil // another table of the publication
		}
		d.relID, d.keyCol = m.RelationID, -1
		for i, c := range m.Columns {
			if c.Name == d.key {
				d.keyCol = i
			}
		}
		if d.keyCol < 0 {
			return fmt.Errorf("%w: the stream of table %s.%s has no column %s", ErrNotPublished, d.schema, d.rel, d.key)
		}
	case *pglogrepl.BeginMessage:
		d.open = true
		d.tx = txn{creates: d.tx.creates[:0], deletes: d.tx.deletes[:0], tags: d.tx.tags[:0]}
	case *pglogrepl.LogicalDecodingMessage:
		switch m.Prefix {
		case originPrefix:
			d.tx.tags = append(d.tx.tags, append([]byte(nil), m.Content...))
		case controlPrefix:
			return sink.control(string(m.Content))
		}
	case *pglogrepl.InsertMessage:
		if m.RelationID == d.relID {
			return d.create(m.Tuple, sink)
		}
	case *pglogrepl.UpdateMessage:
		// Without an old tuple the key did not change: a publication of
		// the key column alone sends it only then.
		if m.RelationID != d.relID || m.OldTuple == nil {
			return nil
		}
		if err := d.delete(m.OldTuple, sink); err != nil {
			return err
		}
		return d.create(m.NewTuple, sink)
	case *pglogrepl.DeleteMessage:
		if m.RelationID == d.relID {
			return d.delete(m.OldTuple, sink)
		}
	case *pglogrepl.TruncateMessage:
		for _, id := range m.RelationIDs {
			d.tx.truncated = d.tx.truncated || id == d.relID
		}
	case *pglogrepl.CommitMessage:
		d.open = false
		d.tx.end = m.TransactionEndLSN
		err := sink.commit(&d.tx)
		if cap(d.tx.creates)+cap(d.tx.deletes) > 4096 {
			d.tx = txn{} // a big transaction's buffers go with it
		}
		return err
	}
	return nil
}

// keyOf returns the text of the key of tuple.
func (d *decoder) keyOf(tuple *pglogrepl.TupleData) (string, error) {
	if tuple == nil || d.keyCol < 0 || d.keyCol >= len(tuple.Columns) || tuple.Columns[d.keyCol].DataType != pglogrepl.TupleDataTypeText {
		return "", fmt.Errorf("postgres: a change of table %s.%s without its key", d.schema, d.rel)
	}
	return string(tuple.Columns[d.keyCol].Data), nil
}

// held is how many keys the open transaction holds back.
func (d *decoder) held() int { return len(d.tx.creates) + len(d.tx.deletes) }

func (d *decoder) create(tuple *pglogrepl.TupleData, sink txnSink) error {
	k, err := d.keyOf(tuple)
	if err != nil {
		return err
	}
	d.tx.creates = append(d.tx.creates, k)
	if d.held() >= d.limit {
		// Applied now rather than at the commit: a tag that comes later
		// does not cover them (an extra copy each, never a missing one).
		d.tx.spilled = true
		err := sink.spill(d.tx.creates)
		d.tx.creates = d.tx.creates[:0]
		return err
	}
	return nil
}

func (d *decoder) delete(tuple *pglogrepl.TupleData, sink txnSink) error {
	k, err := d.keyOf(tuple)
	if err != nil {
		return err
	}
	switch {
	case d.tx.overflow:
	case d.held() >= d.limit:
		if len(d.tx.creates) > 0 {
			// Make room: creations can be passed on early, deletions not.
			d.tx.spilled = true
			if err := sink.spill(d.tx.creates); err != nil {
				return err
			}
			d.tx.creates = d.tx.creates[:0]
			d.tx.deletes = append(d.tx.deletes, k)
			return nil
		}
		d.tx.deletes, d.tx.overflow = nil, true
	default:
		d.tx.deletes = append(d.tx.deletes, k)
	}
	return nil
}
