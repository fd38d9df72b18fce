package mysql

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"

	"github.com/cuckooguard/cuckooguard/follow"
)

// A relayed follower's positions (follow.Commit.Pos, follow.Start.Pos and
// End) are the binlog's own, as one number that grows with the history:
// the file's index (binlog.000012 is 12) in the high 32 bits, the offset
// in it in the low ones. A commit's position is the end of its commit
// event (its XID event, or its COMMIT statement). RESET MASTER starts the
// index at 1 again, and a restored copy of the data directory goes back to
// an earlier file or offset: either is a position that goes back within
// one Origin, which the relay takes for a database that went back, and
// its followers read the tables again.

// encodePos returns the position of offset off in binlog file name.
func encodePos(name string, off uint32) (uint64, error) {
	i := strings.LastIndexByte(name, '.')
	if i < 0 {
		return 0, fmt.Errorf("mysql: binlog file name %q has no index", name)
	}
	idx, err := strconv.ParseUint(name[i+1:], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("mysql: binlog file name %q: %w", name, err)
	}
	return idx<<32 | uint64(off), nil
}

// decodePos returns the file (named as like, an existing file of the
// binlog: its base and the digits of its index) and offset of pos.
func decodePos(pos uint64, like string) (string, uint32) {
	base, digits := like, 6
	if i := strings.LastIndexByte(like, '.'); i >= 0 {
		base, digits = like[:i], len(like)-i-1
	}
	return fmt.Sprintf("%s.%0*d", base, digits, pos>>32), uint32(pos)
}

// originOf returns the Origin of schema db on the server of serverID
// whose GTIDs are of domain: "m<server_id>_<domain>_<fnv32a of db>".
func originOf(serverID, domain uint32, db string) follow.Origin {
	h := fnv.New32a()
	h.Write([]byte(db))
	return follow.Origin{Token: fmt.Sprintf("m%d_%d_%08x", serverID, domain, h.Sum32()),
		Name:        fmt.Sprintf("MariaDB database %s of server id %d, GTID domain %d", db, serverID, domain),
		TokenStream: tokenStream(serverID, domain)}
}

// readOrigin reads the Origin of schema db through c.
func readOrigin(c *client.Conn, db string) (follow.Origin, error) {
	id, domain, err := readServer(c)
	if err != nil {
		return follow.Origin{}, err
	}
	return originOf(id, domain, db), nil
}

// readServer reads the server's id and its default GTID domain (that of
// writers' tokens: WriteToken) through c.
func readServer(c *client.Conn) (id, domain uint32, err error) {
	r, err := c.Execute("SELECT @@GLOBAL.server_id, @@GLOBAL.gtid_domain_id")
	if err != nil {
		return 0, 0, fmt.Errorf("mysql: read the server's id: %w", err)
	}
	i, _ := r.GetUint(0, 0)
	d, _ := r.GetUint(0, 1)
	return uint32(i), uint32(d), nil
}
