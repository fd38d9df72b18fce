package mysql

import (
	"strings"
	"testing"
)

func TestParseDSN(t *testing.T) {
	for _, tc := range []struct {
		name, dsn string
		want      server
		err       string
	}{
		{"full", "app:s3cr@t@tcp(db.internal:3307)/shop", server{user: "app", password: "s3cr@t", host: "db.internal", port: 3307, db: "shop"}, ""},
		{"no password", "root@tcp(127.0.0.1:3306)/x", server{user: "root", host: "127.0.0.1", port: 3306, db: "x"}, ""},
		{"ipv6", "u:p@tcp([::1]:3306)/x", server{user: "u", password: "p", host: "::1", port: 3306, db: "x"}, ""},
		{"no user", "tcp(h:1)/x", server{}, "no user"},
		{"no database", "u@tcp(h:1)/", server{}, "no database"},
		{"params", "u:pw@tcp(h:1)/x?tls=true", server{}, "parameters"},
		{"unix", "u@unix(/tmp/s)/x", server{}, "tcp(host:port)"},
		{"port", "u@tcp(h:0)/x", server{}, "bad port"},
		{"no port", "u@tcp(h)/x", server{}, "missing port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseDSN(tc.dsn)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseDSN(%q) = %v, want an error with %q", tc.dsn, err, tc.err)
				}
				if strings.Contains(err.Error(), "pw") {
					t.Fatalf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseDSN(%q) = %+v, %v; want %+v", tc.dsn, got, err, tc.want)
			}
		})
	}
}
