package postgres

import (
	"context"
	"strings"
	"testing"
)

// TestNilArguments: the package's functions name a nil context,
// connection, transaction or option instead of panicking (the first-hour
// issue). None of these needs a server.
func TestNilArguments(t *testing.T) {
	ctx := context.Background()
	var nilCtx context.Context
	l := emptyLoader(t)
	defer l.Close()
	const dsn = "postgres://nobody@127.0.0.1:1/none?sslmode=disable"
	f, err := NewFollower(l, dsn, "users", "id", parseID)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, want string
		call       func() error
	}{
		{"NewFollower(nil option)", "option 1 of 1 is nil", func() error {
			_, err := NewFollower(l, dsn, "users", "id", parseID, nil)
			return err
		}},
		{"NewFollower(nil loader)", "loader", func() error {
			_, err := NewFollower[int64](nil, dsn, "users", "id", parseID)
			return err
		}},
		{"NewFollower(nil logger)", "logger", func() error {
			_, err := NewFollower(l, dsn, "users", "id", parseID, WithLogger(nil))
			return err
		}},
		{"Run(nil ctx)", "ctx is nil", func() error { return f.Run(nilCtx) }},
		{"Install(nil ctx)", "ctx is nil", func() error { return Install(nilCtx, nil, "users", "id") }},
		{"Install(nil conn)", "conn is nil", func() error { return Install(ctx, nil, "users", "id") }},
		{"Tag(nil tx)", "tx is nil", func() error { return f.Tag(ctx, nil, 1) }},
		{"Tag(no keys)", "no keys", func() error { _, _, err := f.TagQuery(); return err }},
		{"ReadSnapshot(nil conn)", "conn is nil", func() error { _, _, err := ReadSnapshot(ctx, nil); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%s = %v, want an error that says %q", tt.name, err, tt.want)
			}
		})
	}
}
