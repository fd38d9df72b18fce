package mysql

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// TestStreamErrorUndecodable: a decoder's error, as the binlog syncer
// wraps it, reads as errUndecodable (which makes the next session read
// the table), with the event's kind and place but not its bytes; a lost
// connection does not. TestResumeRefused's "inside a transaction" has
// the server send one.
func TestStreamErrorUndecodable(t *testing.T) {
	at := gomysql.Position{Name: "binlog.000001", Pos: 4279}
	data := []byte(strings.Repeat("x", 1<<20))
	ee := &replication.EventError{Header: &replication.EventHeader{EventType: replication.WRITE_ROWS_EVENTv1, EventSize: 1 << 20, LogPos: 5323},
		Err: "table id 33: invalid table id, no corresponding table map event", Data: data}
	err := streamError(fmt.Errorf("trace: %w", ee), at, 7) // the syncer wraps it (errors.Trace)
	if !errors.Is(err, errUndecodable) || !readAgain(err) {
		t.Fatalf("%v: want errUndecodable, and a read", err)
	}
	if len(err.Error()) > 400 || !strings.Contains(err.Error(), "WriteRowsEventV1") || !strings.Contains(err.Error(), "binlog.000001:4279") {
		t.Fatalf("the error (%d bytes) should name the event and the place, not quote the event: %.300s", len(err.Error()), err)
	}
	lost := streamError(fmt.Errorf("io.ReadFull(header) failed. err EOF: %w", gomysql.ErrBadConn), at, 7)
	if errors.Is(lost, errUndecodable) || readAgain(lost) {
		t.Fatalf("%v: a lost connection leaves the resume position", lost)
	}
}

// TestRelaySavedPlaceInsideTransaction: a relay's stream from its saved
// place (where a transaction ended) that begins with anything of a
// transaction but its GTID event is of another history: errHistory,
// which makes the next session start at the binlog's end.
func TestRelaySavedPlaceInsideTransaction(t *testing.T) {
	for _, ev := range []*replication.BinlogEvent{
		{Header: &replication.EventHeader{EventType: replication.WRITE_ROWS_EVENTv1}, Event: &replication.RowsEvent{}},
		{Header: &replication.EventHeader{EventType: replication.TABLE_MAP_EVENT}, Event: &replication.TableMapEvent{}},
		{Header: &replication.EventHeader{EventType: replication.XID_EVENT}, Event: &replication.XIDEvent{}},
		{Header: &replication.EventHeader{EventType: replication.QUERY_EVENT}, Event: &replication.QueryEvent{Query: []byte("COMMIT")}},
	} {
		st := &relayStream{fromSaved: true, at: gomysql.Position{Name: "binlog.000001", Pos: 4279}}
		if err := st.event(ev); !errors.Is(err, errHistory) {
			t.Errorf("%v first from the saved place: %v, want errHistory", ev.Header.EventType, err)
		}
	}
	// Events before the first transaction are not of one.
	st := &relayStream{fromSaved: true}
	for _, ev := range []*replication.BinlogEvent{
		{Header: &replication.EventHeader{EventType: replication.ROTATE_EVENT}, Event: &replication.RotateEvent{NextLogName: []byte("binlog.000001")}},
		{Header: &replication.EventHeader{EventType: replication.FORMAT_DESCRIPTION_EVENT}, Event: &replication.FormatDescriptionEvent{}},
		{Header: &replication.EventHeader{EventType: replication.MARIADB_GTID_LIST_EVENT}, Event: &replication.MariadbGTIDListEvent{}},
	} {
		if err := st.event(ev); err != nil {
			t.Errorf("%v: %v", ev.Header.EventType, err)
		}
	}
}
