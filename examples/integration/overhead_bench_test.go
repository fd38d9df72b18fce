package integration

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// BenchmarkPresentLookup measures what the Loader adds to the lookup of a
// key that exists, against embedded SQLite: the store alone, and through a
// ready Loader, with the request-like cancellable context that net/http
// gives a handler, on GOMAXPROCS goroutines.
func BenchmarkPresentLookup(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := openDB(b, filepath.Join(b.TempDir(), "users.db"))
	const rows = 100_000
	if err := db.Seed(ctx, rows, nil); err != nil {
		b.Fatal(err)
	}
	g, err := guard.New(guard.WithCapacity(rows))
	if err != nil {
		b.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, userdb.User](db.Lookup))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	if err := l.Fill(ctx, db.IDs(ctx)); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name   string
		lookup func(id int64) error
	}{
		{"store", func(id int64) error { _, err := db.Lookup(ctx, id); return err }},
		{"loader", func(id int64) error { _, err := l.Get(ctx, id); return err }},
	} {
		b.Run("via="+bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				id := int64(1)
				for pb.Next() {
					if err := bc.lookup(id); err != nil {
						b.Error(err)
						return
					}
					id = id*7919%rows + 1
				}
			})
		})
	}
}
