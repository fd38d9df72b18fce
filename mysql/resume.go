package mysql

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"
)

// A session that ends for a lost connection, a server restart, another
// reader with its server id (4052) or a heartbeat deadline leaves the
// guard as it was after the last transaction it applied, and the deletions
// it held (visible.go). The next session streams from the start of that
// transaction instead of reading the table, if it can prove that the
// binlog there is the one it followed:
//
//   - the server's @@server_id is the one the position was taken on;
//   - the table's layout is the one its rows were decoded by;
//   - the binlog file is still listed (SHOW BINARY LOGS, where the user
//     may run it), at least as long as the position;
//   - the server's gtid_binlog_pos is, in every GTID domain of the
//     position, at or past the position's: RESET MASTER and a restored
//     copy of the data directory move it back;
//   - and then the stream itself: the first transaction it sends must be
//     the last one applied, byte for byte (its GTID, where it begins and
//     ends, and a hash of its events as the server sent them). It is not
//     applied again. A history that was reset or restored, and then
//     written past the position, has other transactions there.
//
// The stream failing at its first read with error 1236 (the file was
// purged, or the position is past its end) ends the resume as well. In
// each of these cases the next session reads the table into a fresh
// guard; never does one stream from a position it could not prove.

// errHistory is wrapped by the error of a session whose resume position
// turned out not to be in the binlog it followed.
var errHistory = errors.New("mysql: the binlog is not the one the follower followed")

// gtid is a MariaDB GTID: domain-server-seq.
type gtid struct {
	domain, server uint32
	seq            uint64
}

func (g gtid) String() string {
	return fmt.Sprintf("%d-%d-%d", g.domain, g.server, g.seq)
}

// gtidPos is a GTID position: the last GTID of each domain.
type gtidPos map[uint32]gtid

// parseGTIDPos parses a GTID position as the server writes it:
// "0-1-100,1-2-7", or "" for none.
func parseGTIDPos(s string) (gtidPos, error) {
	p := make(gtidPos)
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Split(part, "-")
		if len(f) != 3 {
			return nil, fmt.Errorf("mysql: GTID %q is not domain-server-seq", part)
		}
		d, err1 := strconv.ParseUint(f[0], 10, 32)
		sv, err2 := strconv.ParseUint(f[1], 10, 32)
		seq, err3 := strconv.ParseUint(f[2], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("mysql: GTID %q: %w", part, err)
		}
		p[uint32(d)] = gtid{domain: uint32(d), server: uint32(sv), seq: seq}
	}
	return p, nil
}

func (p gtidPos) String() string {
	domains := make([]uint32, 0, len(p))
	for d := range p {
		domains = append(domains, d)
	}
	slices.Sort(domains)
	var b strings.Builder
	for i, d := range domains {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p[d].String())
	}
	return b.String()
}

// behind returns, for the first domain of p in which cur is behind p (or
// which cur lacks), a description; "" if cur is at or past p in each.
func (p gtidPos) behind(cur gtidPos) string {
	for d, g := range p {
		c, ok := cur[d]
		switch {
		case !ok:
			return fmt.Sprintf("domain %d has no GTID on the server (the position's is %v)", d, g)
		case c.seq < g.seq:
			return fmt.Sprintf("domain %d is at %v on the server, the position's is %v", d, c, g)
		}
	}
	return ""
}

// source is what the server says of itself and its binlog now.
type source struct {
	serverID uint32
	pos      gtidPos          // @@gtid_binlog_pos
	files    map[string]int64 // SHOW BINARY LOGS: size by name; nil if the user may not list them
}

// readSource reads the server's identity and its binlog's state.
func readSource(c *client.Conn) (source, error) {
	r, err := c.Execute("SELECT @@GLOBAL.server_id, @@GLOBAL.gtid_binlog_pos")
	if err != nil {
		return source{}, fmt.Errorf("mysql: read the server's id and GTID position: %w", err)
	}
	id, _ := r.GetUint(0, 0)
	text, _ := r.GetString(0, 1)
	pos, err := parseGTIDPos(text)
	if err != nil {
		return source{}, err
	}
	s := source{serverID: uint32(id), pos: pos}
	// A user without BINLOG MONITOR may not list the binlogs: the stream
	// then says whether the file is there (error 1236 if not).
	if r, err := c.Execute("SHOW BINARY LOGS"); err == nil {
		s.files = make(map[string]int64, r.RowNumber())
		for i := range r.RowNumber() {
			name, _ := r.GetString(i, 0)
			size, _ := r.GetInt(i, 1)
			s.files[name] = size
		}
	}
	return s, nil
}

// resumePoint is where a session may stream from instead of reading the
// table: the last transaction applied to the guard, on the server and in
// the table's layout it was read from.
type resumePoint struct {
	serverID uint32
	col      column  // the layout the stream's rows decode by
	file     string  // the binlog file of the transaction
	start    uint32  // where it begins: its GTID event
	end      uint32  // where it ends: the stream goes on from here
	gtid     gtid    // its GTID
	sum      uint64  // xxh3 of its events, as the server sent them
	pos      gtidPos // the binlog's GTID position after it
}

func (p *resumePoint) String() string {
	return fmt.Sprintf("%s:%d gtid %s", p.file, p.end, p.pos)
}

// refuse returns why the binlog of src cannot be the one p is a position
// in, for a table now laid out as col; "" if nothing says so before the
// stream starts (the stream checks the transaction itself).
func (p *resumePoint) refuse(src source, col column) string {
	switch {
	case src.serverID != p.serverID:
		return fmt.Sprintf("the server's id is %d, the position was taken on server %d", src.serverID, p.serverID)
	case !col.same(p.col):
		return "the table's layout changed"
	}
	if src.files != nil {
		size, ok := src.files[p.file]
		switch {
		case !ok:
			return fmt.Sprintf("binlog file %s is gone (purged, or RESET MASTER)", p.file)
		case size < int64(p.end):
			return fmt.Sprintf("binlog file %s ends at %d, before the position %d: the binlog was reset or restored", p.file, size, p.end)
		}
	}
	if why := p.pos.behind(src.pos); why != "" {
		return "the server's binlog is behind the position (RESET MASTER, or a restored copy of the data directory): " + why
	}
	return ""
}
