package mysql

import (
	"context"
	"testing"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// BenchmarkLookupToken measures a lookup of a key the guard rejects, on a
// ready Loader whose Follower reports positions: without a token (the
// path every lookup takes), through MayContain and through
// MayContainContext once tokens are in use in the process, and with a
// token the stream has reached.
func BenchmarkLookupToken(b *testing.B) {
	l, f, feed := benchFollower(b)
	for k := range int64(1000) {
		if err := feed.Apply(guarded.Change[int64]{Key: k}); err != nil {
			b.Fatal(err)
		}
	}
	feed.MarkReady()
	f.startPositions(1, 0, gtidPos{0: {0, 1, 100}})
	plain := context.Background()
	tok := mustToken(b, "mariadb-1-0", 50)
	withTok := guarded.WithToken(plain, tok) // from here on, tokens are in use in the process
	for _, bc := range []struct {
		name string
		f    func(k int64) bool
	}{
		{"path=MayContain", func(k int64) bool { return l.MayContain(k) }},
		{"path=MayContainContext/token=none", func(k int64) bool { return l.MayContainContext(plain, k) }},
		{"path=MayContainContext/token=reached", func(k int64) bool { return l.MayContainContext(withTok, k) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			k := int64(1_000_000)
			for b.Loop() {
				k++
				if bc.f(k) {
					n++
				}
			}
			b.ReportMetric(float64(n)/float64(b.N), "present/op")
		})
	}
}

// BenchmarkReportPosition measures what the Follower adds to each
// transaction it applies: reporting its position to the Loader.
func BenchmarkReportPosition(b *testing.B) {
	_, f, _ := benchFollower(b)
	f.startPositions(1, 0, gtidPos{})
	b.ReportAllocs()
	seq := uint64(0)
	for b.Loop() {
		seq++
		f.reachAfter(seq)
	}
}

// benchFollower returns a Loader of an empty guard whose store has no
// key, and a Follower (never run) attached to it through the returned
// feed; both are closed when the benchmark ends.
func benchFollower(b *testing.B) (*guarded.Loader[int64, string], *Follower[int64], *guarded.Feed[int64]) {
	b.Helper()
	g, err := guard.New()
	if err != nil {
		b.Fatal(err)
	}
	l, err := guarded.New(g, guarded.GetterFunc[int64, string](func(context.Context, int64) (string, error) { return "", guarded.ErrNotFound }))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	f, err := NewFollower[int64](l, "u@tcp(127.0.0.1:1)/db", "t", "id", parseInt64)
	if err != nil {
		b.Fatal(err)
	}
	feed, err := l.AttachFeed()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(feed.Detach)
	f.feed = feed
	return l, f, feed
}
