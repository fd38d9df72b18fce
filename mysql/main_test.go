package mysql

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testDSN returns CUCKOOGUARD_MYSQL_DSN, a server with a row-based binlog
// (.ci/run starts one). Without it the test skips, except under CI=true,
// where a missing server is a failure: CI must run these tests.
func testDSN(t testing.TB) server {
	t.Helper()
	dsn := os.Getenv("CUCKOOGUARD_MYSQL_DSN")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and CUCKOOGUARD_MYSQL_DSN is unset: .ci/run starts a MariaDB server and sets it")
		}
		t.Skip("set CUCKOOGUARD_MYSQL_DSN=root@tcp(127.0.0.1:3306)/db to run against MariaDB (.ci/run starts one)")
	}
	s, err := parseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// connect opens a client connection to s, closed when the test ends.
func connect(t testing.TB, s server) *client.Conn {
	t.Helper()
	c, err := client.ConnectWithTimeout(s.addr(), s.user, s.password, s.db, 10*time.Second)
	if err != nil {
		t.Fatalf("connect to %s: %v", s.addr(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestServer checks what the other tests assume of CUCKOOGUARD_MYSQL_DSN's
// server: a binary log in row format with full row images, and the
// collation .ci/run and Debian configure.
func TestServer(t *testing.T) {
	c := connect(t, testDSN(t))
	r, err := c.Execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@collation_server, VERSION()")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := range 5 {
		v, _ := r.GetString(0, i)
		got = append(got, v)
	}
	t.Logf("server %s: log_bin %s, binlog_format %s, binlog_row_image %s, collation %s", got[4], got[0], got[1], got[2], got[3])
	if got[0] != "1" || got[1] != "ROW" || got[2] != "FULL" || got[3] != "utf8mb4_general_ci" {
		t.Fatalf("got log_bin %s, binlog_format %s, binlog_row_image %s, collation %s; want 1, ROW, FULL, utf8mb4_general_ci", got[0], got[1], got[2], got[3])
	}
}

var tableSeq atomic.Int64

// tableName returns a table name of the test's own, in the DSN's database.
func tableName(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	return fmt.Sprintf("cg_%s_%d_%d", name, time.Now().UnixNano()%1e6, tableSeq.Add(1))
}
