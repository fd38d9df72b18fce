package mysql

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// runOnce runs a Follower of table's key column as user until it returns
// or follows; it returns Run's error (nil if it followed).
func runOnce(t *testing.T, srv server, table, key string) error {
	t.Helper()
	g, err := guard.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[string, string](func(context.Context, string) (string, error) { return "", guarded.ErrNotFound }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := NewFollower(l, dsnOf(srv), table, key, parseString)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Millisecond):
			if f.Stats().State == Following && l.Ready() {
				cancel()
				<-done
				return nil
			}
		}
	}
}

// TestSetupRefused checks that a setup that cannot work ends Run at its
// first session with an error that names the cause and the fix.
func TestSetupRefused(t *testing.T) {
	srv := testDSN(t)
	c := connect(t, srv)
	user := "cg_setup_" + strings.ReplaceAll(tableName(t)[len(tableName(t))-6:], "_", "")
	exec(t, c, "DROP USER IF EXISTS '"+user+"'@'%'", "CREATE USER '"+user+"'@'%' IDENTIFIED BY 'pw'")
	t.Cleanup(func() { exec(t, connect(t, srv), "DROP USER IF EXISTS '"+user+"'@'%'") })
	as := srv
	as.user, as.password = user, "pw"
	for _, tc := range []struct {
		name   string
		create string // %s: the table
		key    string
		before []string // run before, as root; undone by after
		after  []string
		user   bool
		want   error
		says   []string
	}{
		{name: "no unique key", create: "CREATE TABLE %s (k VARCHAR(10) NOT NULL, v INT) ENGINE=InnoDB", key: "k", want: ErrSetup, says: []string{"PRIMARY KEY", "UNIQUE"}},
		{name: "prefix key", create: "CREATE TABLE %s (k VARCHAR(100) NOT NULL, UNIQUE KEY (k(10))) ENGINE=InnoDB", key: "k", want: ErrSetup, says: []string{"PRIMARY KEY"}},
		{name: "nullable", create: "CREATE TABLE %s (id INT PRIMARY KEY, k VARCHAR(10) NULL UNIQUE) ENGINE=InnoDB", key: "k", want: ErrSetup, says: []string{"NOT NULL"}},
		{name: "not innodb", create: "CREATE TABLE %s (k VARCHAR(10) NOT NULL PRIMARY KEY) ENGINE=MyISAM", key: "k", want: ErrSetup, says: []string{"InnoDB"}},
		{name: "no column", create: "CREATE TABLE %s (k VARCHAR(10) NOT NULL PRIMARY KEY) ENGINE=InnoDB", key: "nope", want: ErrSetup, says: []string{"no column nope"}},
		{name: "uca1400_ai_ci", create: "CREATE TABLE %s (k VARCHAR(10) COLLATE utf8mb4_uca1400_ai_ci NOT NULL PRIMARY KEY) ENGINE=InnoDB", key: "k", want: ErrKeyType, says: []string{"utf8mb4_uca1400_ai_ci", "ALTER", "column k"}},
		{name: "float", create: "CREATE TABLE %s (k DOUBLE NOT NULL PRIMARY KEY) ENGINE=InnoDB", key: "k", want: ErrKeyType, says: []string{"double"}},
		{name: "binlog_row_image", create: "CREATE TABLE %s (k VARCHAR(10) NOT NULL PRIMARY KEY) ENGINE=InnoDB", key: "k",
			before: []string{"SET GLOBAL binlog_row_image = 'MINIMAL'"}, after: []string{"SET GLOBAL binlog_row_image = 'FULL'"},
			want: ErrSetup, says: []string{"binlog_row_image is MINIMAL", "FULL"}},
		{name: "binlog_format", create: "CREATE TABLE %s (k VARCHAR(10) NOT NULL PRIMARY KEY) ENGINE=InnoDB", key: "k",
			before: []string{"SET GLOBAL binlog_format = 'MIXED'"}, after: []string{"SET GLOBAL binlog_format = 'ROW'"},
			want: ErrSetup, says: []string{"binlog_format is MIXED", "ROW"}},
		{name: "no REPLICATION SLAVE", create: "CREATE TABLE %s (k VARCHAR(10) NOT NULL PRIMARY KEY) ENGINE=InnoDB", key: "k", user: true,
			before: []string{"GRANT SELECT, CREATE, INSERT, UPDATE ON " + srv.db + ".* TO '" + user + "'@'%'"},
			after:  []string{"REVOKE ALL PRIVILEGES, GRANT OPTION FROM '" + user + "'@'%'"},
			want:   ErrSetup, says: []string{"1045", "REPLICATION SLAVE", "not only to a wrong password"}},
		{name: "no SELECT", create: "CREATE TABLE %s (k VARCHAR(10) NOT NULL PRIMARY KEY) ENGINE=InnoDB", key: "k", user: true,
			before: []string{"GRANT REPLICATION SLAVE ON *.* TO '" + user + "'@'%'"},
			after:  []string{"REVOKE ALL PRIVILEGES, GRANT OPTION FROM '" + user + "'@'%'"},
			want:   ErrSetup, says: []string{"GRANT SELECT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := tableName(t)
			exec(t, c, strings.ReplaceAll(tc.create, "%s", "`"+table+"`"))
			t.Cleanup(func() { exec(t, c, "DROP TABLE IF EXISTS `"+table+"`") })
			exec(t, c, tc.before...)
			t.Cleanup(func() { exec(t, c, tc.after...) })
			who := srv
			if tc.user {
				who = as
			}
			err := runOnce(t, who, table, tc.key)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Run = %v, want %v", err, tc.want)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Run = %v, want it to say %q", err, s)
				}
			}
			t.Logf("%v", err)
		})
	}
	// The least privileges: REPLICATION SLAVE, SELECT on the table, and
	// INSERT and UPDATE on an existing heartbeat table.
	t.Run("least privileges follow", func(t *testing.T) {
		table := tableName(t)
		exec(t, c, "CREATE TABLE `"+table+"` (k VARCHAR(10) NOT NULL PRIMARY KEY) ENGINE=InnoDB",
			"CREATE TABLE IF NOT EXISTS `"+DefaultHeartbeatTable+"` (id INT UNSIGNED NOT NULL PRIMARY KEY, beat VARCHAR(100) NOT NULL) ENGINE=InnoDB",
			"GRANT REPLICATION SLAVE ON *.* TO '"+user+"'@'%'",
			"GRANT SELECT ON `"+srv.db+"`.`"+table+"` TO '"+user+"'@'%'",
			"GRANT SELECT, INSERT, UPDATE, CREATE ON `"+srv.db+"`.`"+DefaultHeartbeatTable+"` TO '"+user+"'@'%'")
		t.Cleanup(func() {
			exec(t, c, "DROP TABLE IF EXISTS `"+table+"`", "REVOKE ALL PRIVILEGES, GRANT OPTION FROM '"+user+"'@'%'")
		})
		if err := runOnce(t, as, table, "k"); err != nil {
			t.Fatalf("Run = %v, want it to follow", err)
		}
	})
}
