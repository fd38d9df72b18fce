package mysql

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// server is where a Follower connects: the parts of a DSN it uses.
type server struct {
	user, password string
	host           string
	port           uint16
	db             string
}

// addr is host:port.
func (s server) addr() string { return net.JoinHostPort(s.host, strconv.Itoa(int(s.port))) }

// parseDSN reads a DSN in the form of github.com/go-sql-driver/mysql,
// user:password@tcp(host:port)/dbname, the form a Go service on MySQL
// configures already. Only TCP is supported (the binlog stream is a TCP
// client of the server), and no parameters: one the Follower would ignore
// could be one the caller relies on (a TLS setting, say), so it is refused.
func parseDSN(dsn string) (server, error) {
	var s server
	bad := func(why string) (server, error) {
		return server{}, fmt.Errorf("mysql: DSN %q: %s; want user:password@tcp(host:port)/dbname", redact(dsn), why)
	}
	at := strings.LastIndex(dsn, "@")
	if at < 0 {
		return bad("no user")
	}
	cred, rest := dsn[:at], dsn[at+1:]
	s.user, s.password, _ = strings.Cut(cred, ":")
	if s.user == "" {
		return bad("no user")
	}
	slash := strings.Index(rest, "/")
	if slash < 0 {
		return bad("no database")
	}
	netAddr, db := rest[:slash], rest[slash+1:]
	if i := strings.IndexByte(db, '?'); i >= 0 {
		return bad("parameters are not supported")
	}
	if db == "" {
		return bad("no database")
	}
	s.db = db
	addr, ok := strings.CutPrefix(netAddr, "tcp(")
	if !ok || !strings.HasSuffix(addr, ")") {
		return bad("the address must be tcp(host:port)")
	}
	host, port, err := net.SplitHostPort(strings.TrimSuffix(addr, ")"))
	if err != nil {
		return bad(err.Error())
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return bad("bad port")
	}
	s.host, s.port = host, uint16(p)
	return s, nil
}

// redact hides the password of a DSN for an error message.
func redact(dsn string) string {
	at := strings.LastIndex(dsn, "@")
	if at < 0 {
		return dsn
	}
	user, _, hasPass := strings.Cut(dsn[:at], ":")
	if !hasPass {
		return dsn
	}
	return user + ":***" + dsn[at:]
}
