package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/go-mysql-org/go-mysql/client"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// A token's position is the GTID sequence number of one GTID domain, and
// its stream names the server and the domain: "mariadb-<server_id>-<domain>".
//
// Why the sequence number: a writer reads it without any privilege
// (@@gtid_binlog_pos), and the follower sees it at each transaction's GTID
// event. Under gtid_strict_mode the server refuses a GTID whose sequence
// number is not above the domain's last one, so in one domain the binlog's
// order is the order of the sequence numbers: a follower that applied the
// transaction of sequence number n applied every transaction of the domain
// before it, and every transaction of any domain before it in the binlog.
// (Without strict mode a session may SET gtid_seq_no lower, and a later
// transaction could be judged applied before an earlier one: WriteToken
// refuses.) The binlog's file and offset are in its order too, but a
// writer may not read them (SHOW MASTER STATUS needs BINLOG MONITOR).
//
// Why gtid_binlog_pos and not @@last_gtid: the last is the GTID of what
// the session committed last, and a pool hands a writer any of its
// connections: one whose last commit is an hour old would name a position
// before the write, which a follower reaches long before the write, and a
// lookup of its key could answer absent: the wrong 404 the token is for.
// The domain's last sequence number in gtid_binlog_pos is at or after
// every commit the binlog holds, from any session: a token of it is
// reached a little later at most (the commits of other sessions since).
//
// Why one domain: positions of two domains are not comparable, and one
// number names one. A server whose binlog has several domains (a session
// that SET gtid_domain_id, multi-source replication) gives no tokens: a
// write in another domain than the token's would not be covered by it.
//
// Why the server's id: a switched source (a replica made primary) goes on
// with the same domain and sequence numbers but another server id, and a
// follower that has not moved to it yet must not judge its tokens; a
// follower names its positions after the server it streams from (the
// server_id it proves at each session), so until it follows the new
// server, lookups under the new server's tokens pass through. RESET
// MASTER starts the sequence numbers again at 1 on the same server: see
// the package doc's "Reading your own writes" for what happens then.

// Querier is where [WriteToken] reads the server's position: a *sql.DB, a
// *sql.Conn or a *sql.Tx of any MySQL driver has the method.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// tokenQuery reads what a token is made of, and whether the session is in
// a transaction (whose commit would come after the position).
const tokenQuery = "SELECT @@GLOBAL.server_id, @@GLOBAL.gtid_domain_id, @@GLOBAL.gtid_binlog_pos, @@GLOBAL.gtid_strict_mode, @@in_transaction"

// WriteToken returns the consistency token ([guarded.Token]) of every
// write committed before it is called: a position in the server's binlog
// at or after each of their commits (the last GTID sequence number of
// the binlog's one GTID domain), in a stream named after the server's
// @@server_id and the domain. Call it after the write's commit has
// returned, on any connection to the server the write went to (the
// *sql.DB it went through, a *sql.Conn, a *sql.Tx after another's
// commit): the position is the server's, not the session's. Called inside
// a transaction of the session, it returns an error: the position would
// be before that transaction's commit.
//
// A Loader that a [Follower] keeps in step with a table of that server
// answers "absent" for a lookup made under the token
// ([guarded.WithToken]) only once the Follower has applied every change
// up to it; until then the lookup waits, up to [guarded.WithTokenWait],
// and then passes through to the store. A token of another server or
// domain, or of a server whose binlog the Follower does not follow yet,
// passes through at once. See the package doc's "Reading your own
// writes".
//
// It returns an error wrapping [ErrNoToken] if the server cannot give a
// token that a Follower could judge: gtid_strict_mode is OFF, or the
// binlog has GTIDs of more than one domain. It costs one round trip and
// needs no privilege.
func WriteToken(ctx context.Context, q Querier) (guarded.Token, error) {
	if ctx == nil || q == nil {
		return guarded.Token{}, errors.New("mysql: WriteToken needs a context and a connection")
	}
	var id, domain uint32
	var pos string
	var strict, inTx int64
	if err := q.QueryRowContext(ctx, tokenQuery).Scan(&id, &domain, &pos, &strict, &inTx); err != nil {
		return guarded.Token{}, fmt.Errorf("mysql: write token: %w", err)
	}
	if inTx != 0 {
		return guarded.Token{}, errors.New("mysql: write token: the session is in a transaction: call WriteToken after the commit has returned")
	}
	return tokenOf(id, domain, pos, strict != 0)
}

// WriteTokenConn is [WriteToken] on a connection of
// github.com/go-mysql-org/go-mysql's client.
func WriteTokenConn(c *client.Conn) (guarded.Token, error) {
	if c == nil {
		return guarded.Token{}, errors.New("mysql: WriteTokenConn needs a connection")
	}
	r, err := c.Execute(tokenQuery)
	if err != nil {
		return guarded.Token{}, fmt.Errorf("mysql: write token: %w", err)
	}
	defer r.Close()
	id, err1 := r.GetUint(0, 0)
	domain, err2 := r.GetUint(0, 1)
	pos, err3 := r.GetString(0, 2)
	strict, err4 := r.GetInt(0, 3)
	inTx, err5 := r.GetInt(0, 4)
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return guarded.Token{}, fmt.Errorf("mysql: write token: %w", err)
	}
	if inTx != 0 {
		return guarded.Token{}, errors.New("mysql: write token: the session is in a transaction: call WriteToken after the commit has returned")
	}
	return tokenOf(uint32(id), uint32(domain), pos, strict != 0)
}

// tokenOf returns the token of binlog GTID position pos on server id,
// whose default GTID domain is domain.
func tokenOf(id, domain uint32, pos string, strict bool) (guarded.Token, error) {
	if !strict {
		return guarded.Token{}, fmt.Errorf("%w: gtid_strict_mode is OFF, so a transaction's GTID sequence number need not be above the last one's: SET GLOBAL gtid_strict_mode = ON, and set it in the server's configuration", ErrNoToken)
	}
	p, err := parseGTIDPos(pos)
	if err != nil {
		return guarded.Token{}, fmt.Errorf("mysql: write token: %w", err)
	}
	var seq uint64
	switch len(p) {
	case 0: // nothing in the binlog: the token of nothing
	case 1:
		for d, g := range p {
			domain, seq = d, g.seq
		}
	default:
		return guarded.Token{}, fmt.Errorf("%w: the binlog has GTIDs of several domains (%v), and a token names a position in one: write in one domain, and remove the others' with FLUSH BINARY LOGS DELETE_DOMAIN_ID once their binlogs are purged", ErrNoToken, p)
	}
	return guarded.NewToken(tokenStream(id, domain), seq)
}

// tokenStream names the positions of GTID domain domain of the binlog of
// server id.
func tokenStream(id, domain uint32) string {
	return "mariadb-" + strconv.FormatUint(uint64(id), 10) + "-" + strconv.FormatUint(uint64(domain), 10)
}

// The Follower reports each position to the Loader's feed
// ([guarded.Feed.Reached]) once the guard holds every change up to it:
// at a session's start, the position it read the table at (or resumes
// from), and then each transaction of the domain it applies. A deletion
// waits to be visible (visible.go) before it is applied, and until it is,
// neither its transaction's position nor a later one is reported: the
// positions wait in holdings.after, each behind the deletions held when
// it was reached.

// tokenDomain reads, at a session's start, the GTID domain whose
// positions the session reports: the server's default, the domain of the
// Follower's heartbeats. The stream is named after it and the server's
// id, which the session proves (resume.go).
func tokenDomain(c *client.Conn) (uint32, error) {
	r, err := c.Execute("SELECT @@GLOBAL.gtid_domain_id")
	if err != nil {
		return 0, fmt.Errorf("mysql: read the server's GTID domain: %w", err)
	}
	defer r.Close()
	d, err := r.GetUint(0, 0)
	if err != nil {
		return 0, fmt.Errorf("mysql: read the server's GTID domain: %w", err)
	}
	return uint32(d), nil
}

// startPositions names the stream of the session's positions, and
// reports pos, where the session starts (the read's position, or the last
// transaction applied).
func (f *Follower[K]) startPositions(id, domain uint32, pos gtidPos) {
	if stream := tokenStream(id, domain); stream != f.tokStream {
		// Another server or domain: its positions mean nothing in the
		// old one's stream.
		f.tokStream, f.tokDomain = stream, domain
	}
	f.reachAfter(pos[domain].seq)
}

// reachAfter reports seq, the position of the transaction of the
// session's domain just applied (or where the session starts). Deletions
// that wait to be visible (visible.go) do not hold it back: a key whose
// deletion waits is still in the guard, which answers "present" (a false
// positive, as without a token), never "absent" for a key a write under
// the token made.
func (f *Follower[K]) reachAfter(seq uint64) { f.reached(seq) }

// reached tells the Loader that its guard holds every change of the
// session's stream up to seq.
func (f *Follower[K]) reached(seq uint64) {
	if f.tokStream == "" {
		return
	}
	if t, err := guarded.NewToken(f.tokStream, seq); err == nil {
		f.feed.Reached(t)
	}
}
