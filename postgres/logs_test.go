package postgres

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
)

// TestFollowerLogs is the first week's logging finding: the first start
// with a snapshot file warned that it could not start from it (every first
// deploy fired the suggested alert), and the follower's own "table"
// attribute doubled a user's logger attribute of that name.
func TestFollowerLogs(t *testing.T) {
	dsn := setupUsers(t, 100)
	var out syncBuffer
	logger := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})).With("table", "the service's own")
	file := filepath.Join(t.TempDir(), "users.guard")
	a := startNode(t, dsn, "users", "id", "A", parseInt64, nodeConf{opts: []Option{WithSnapshotFile(file), WithLogger(logger)}})
	a.halt()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatal("the follower logged nothing")
	}
	for _, line := range lines {
		if strings.Count(line, `"table":`) != 2 {
			t.Errorf("a line without the user's table and the follower's, one each: %s", line)
		}
		var rec struct {
			Level       string
			Table       string
			Cuckooguard struct{ Table string }
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		if rec.Table != "the service's own" || rec.Cuckooguard.Table != "users" {
			t.Errorf("table %q, cuckooguard.table %q: %s", rec.Table, rec.Cuckooguard.Table, line)
		}
		if rec.Level == "WARN" || rec.Level == "ERROR" {
			t.Errorf("a first start logged at %s: %s", rec.Level, line)
		}
	}
	t.Logf("%d lines, e.g. %s", len(lines), lines[0])
}
