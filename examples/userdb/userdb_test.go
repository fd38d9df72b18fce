package userdb

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDefaultSQLitePath: the default SQLite file is the user's, in the
// user's cache directory, not a name in the shared /tmp that another
// user's run may have left behind.
func TestDefaultSQLitePath(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache) // os.UserCacheDir on Linux
	t.Setenv("HOME", cache)           // and on macOS
	path := DefaultSQLitePath("sqlwrap")
	if !strings.HasPrefix(path, cache+string(filepath.Separator)) {
		t.Fatalf("DefaultSQLitePath = %q, want a file under the user's cache directory %s", path, cache)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("its directory: %v, %v; want one only the user may enter", fi, err)
	}
}
