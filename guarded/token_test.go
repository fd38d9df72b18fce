package guarded

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cuckooguard/cuckooguard/guard"
)

func TestTokenText(t *testing.T) {
	tok, err := NewToken("7303918273_5", 0x1a2b3c)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.String(); got != "7303918273_5.1a2b3c" {
		t.Fatalf("String = %q", got)
	}
	back, err := ParseToken(tok.String())
	if err != nil || back != tok {
		t.Fatalf("ParseToken(%q) = %v, %v; want %v", tok, back, err, tok)
	}
	if (Token{}).String() != "" || !(Token{}).IsZero() {
		t.Fatal("the zero Token is not empty")
	}
	for _, bad := range []string{
		"", ".", "a.", ".1", "a", "a.g", "a.-1", "a. 1", "a.1 ", "a b.1", "a;b.1", "a.12345678901234567",
		"a.A", "a\x00.1", strings.Repeat("a", 65) + ".1", "a.0x1",
	} {
		if tok, err := ParseToken(bad); err == nil {
			t.Errorf("ParseToken(%q) = %v, want an error", bad, tok)
		}
	}
	for _, bad := range []string{"", "a.b", "a/b", strings.Repeat("x", 65)} {
		if _, err := NewToken(bad, 1); err == nil {
			t.Errorf("NewToken(%q) took it", bad)
		}
	}
	a, _ := NewToken("s", 5)
	b, _ := NewToken("s", 9)
	o, _ := NewToken("other", 100)
	if a.Later(b) != b || b.Later(a) != b || (Token{}).Later(a) != a || a.Later(Token{}) != a || a.Later(o) != a {
		t.Fatal("Later")
	}
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"7303918273_5.1a2b3c", "a.0", "a.ffffffffffffffff", "a..1", "-_.9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			return
		}
		// The text is canonical but for leading zeros of the position.
		if back, err := ParseToken(tok.String()); err != nil || back != tok {
			t.Fatalf("%q: %v does not read back: %v, %v", s, tok, back, err)
		}
		if len(tok.String()) > len(s) {
			t.Fatalf("%q: String %q is longer", s, tok.String())
		}
	})
}

// tokenSetup is a ready Loader over a store of keys 0..99, with its feed
// at position 10 of stream "db".
func tokenSetup(t *testing.T, opts ...Option) (*Loader[int, string], *Feed[int], *memStore[int]) {
	t.Helper()
	s := newMemStore[int]()
	for i := range 100 {
		s.put(i, "r")
	}
	l := newTestLoader(t, s, []guard.Option{guard.WithCapacity(1000)}, opts...)
	feed, err := l.AttachFeed()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(feed.Detach)
	if err := feed.Resync(context.Background(), s.readAll); err != nil {
		t.Fatal(err)
	}
	feed.Reached(mustToken(t, "db", 10))
	feed.MarkReady()
	return l, feed, s
}

func mustToken(t *testing.T, stream string, pos uint64) Token {
	t.Helper()
	tok, err := NewToken(stream, pos)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// tokenLookups are the lookups that honour a token, each reporting
// whether the key was found.
var tokenLookups = []struct {
	name string
	find func(ctx context.Context, l *Loader[int, string], key int) (bool, error)
}{
	{"Get", func(ctx context.Context, l *Loader[int, string], key int) (bool, error) {
		_, err := l.Get(ctx, key)
		if errors.Is(err, ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	}},
	{"GetMany", func(ctx context.Context, l *Loader[int, string], key int) (bool, error) {
		_, errs := l.GetMany(ctx, []int{key, key + 1_000_000})
		if errors.Is(errs[0], ErrNotFound) {
			return false, nil
		}
		return errs[0] == nil, errs[0]
	}},
	{"MayContainContext", func(ctx context.Context, l *Loader[int, string], key int) (bool, error) {
		return l.MayContainContext(ctx, key), nil
	}},
}

// TestTokenReadYourWrites: a row created elsewhere, whose change this
// Loader's stream has not applied yet, is found by a lookup under the
// write's token: the lookup waits for the stream to reach the token. The
// same lookup without the token is answered "absent" (the guard has not
// heard of the row), which is what the token is for.
func TestTokenReadYourWrites(t *testing.T) {
	for _, lk := range tokenLookups {
		t.Run(lk.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, feed, s := tokenSetup(t)
				ctx := context.Background()
				s.put(500, "new") // committed at position 20, elsewhere
				tok := mustToken(t, "db", 20)
				if found, _ := lk.find(ctx, l, 500); found {
					t.Fatal("without the token the guard found a key it has not heard of: the test proves nothing")
				}
				go func() {
					time.Sleep(5 * time.Millisecond) // the stream's lag
					if err := feed.Apply(Change[int]{Key: 500}); err != nil {
						t.Error(err)
					}
					feed.Reached(mustToken(t, "db", 21))
				}()
				start := time.Now()
				found, err := lk.find(WithToken(ctx, tok), l, 500)
				if err != nil || !found {
					t.Fatalf("under the token: found %v, %v", found, err)
				}
				if waited := time.Since(start); waited != 5*time.Millisecond {
					t.Errorf("waited %v for a stream 5ms behind", waited)
				}
				st := l.Stats()
				if st.TokenLookups != 1 || st.TokenWaits != 1 || st.TokenPassed != 0 {
					t.Errorf("stats: %+v", st)
				}
				// Reached now: an absent key under the token is answered
				// at once, from the guard.
				calls := st.StoreCalls
				start = time.Now()
				if found, err := lk.find(WithToken(ctx, tok), l, 424242); found || err != nil {
					t.Fatalf("absent key under a reached token: %v, %v", found, err)
				}
				if time.Since(start) != 0 || l.Stats().StoreCalls != calls {
					t.Error("a lookup under a reached token waited or asked the store")
				}
			})
		})
	}
}

// TestTokenPassesThrough: a stream that does not reach the token within
// WithTokenWait, a token of another stream, and a Loader whose stream
// reported no position: each lookup goes to the store, which finds the
// row. None answers "absent" for it.
func TestTokenPassesThrough(t *testing.T) {
	for _, lk := range tokenLookups {
		t.Run(lk.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, _, s := tokenSetup(t, WithTokenWait(30*time.Millisecond))
				ctx := context.Background()
				s.put(500, "new")
				start := time.Now()
				found, err := lk.find(WithToken(ctx, mustToken(t, "db", 20)), l, 500)
				if err != nil || !found {
					t.Fatalf("behind the token: found %v, %v; want it from the store", found, err)
				}
				if waited := time.Since(start); waited != 30*time.Millisecond {
					t.Errorf("waited %v, want the bound 30ms", waited)
				}
				start = time.Now()
				found, err = lk.find(WithToken(ctx, mustToken(t, "otherdb", 1)), l, 500)
				if err != nil || !found || time.Since(start) != 0 {
					t.Fatalf("foreign token: found %v, %v after %v; want it from the store at once", found, err, time.Since(start))
				}
				// A ctx that ends stops the wait.
				cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
				defer cancel()
				start = time.Now()
				found, _ = lk.find(WithToken(cctx, mustToken(t, "db", 20)), l, 500)
				if found && time.Since(start) > 10*time.Millisecond {
					t.Errorf("waited %v past the ctx's end", time.Since(start))
				}
				st := l.Stats()
				if st.TokenLookups != 3 || st.TokenPassed != 2 || st.TokenForeign != 1 {
					t.Errorf("stats: %+v", st)
				}
			})
		})
	}
	t.Run("no position", func(t *testing.T) {
		s := newMemStore[int]()
		s.put(7, "x")
		l := newTestLoader(t, s, []guard.Option{guard.WithCapacity(100)})
		l.MarkReady() // a Loader filled by hand: no stream, no positions
		if _, err := l.Get(WithToken(context.Background(), mustToken(t, "db", 1)), 7); err != nil {
			t.Fatalf("Get under a token on a Loader without a stream: %v", err)
		}
		if !l.Position().IsZero() {
			t.Fatal("Position of a Loader without a stream")
		}
	})
}

// TestTokenWaitersWake: many lookups wait on one stream; each wakes as
// soon as the stream passes its own token, in any order of arrival.
func TestTokenWaitersWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, feed, s := tokenSetup(t, WithTokenWait(time.Second))
		for i := range 50 {
			s.put(1000+i, "new")
		}
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				_, err := l.Get(WithToken(context.Background(), mustToken(t, "db", uint64(100+i))), 1000+i)
				if err != nil {
					t.Errorf("key %d: %v", 1000+i, err)
				}
				if want := time.Duration(i+1) * time.Millisecond; time.Since(start) != want {
					t.Errorf("key %d waited %v, want %v", 1000+i, time.Since(start), want)
				}
			}()
		}
		synctest.Wait()
		for i := range 50 {
			time.Sleep(time.Millisecond)
			if err := feed.Apply(Change[int]{Key: 1000 + i}); err != nil {
				t.Fatal(err)
			}
			feed.Reached(mustToken(t, "db", uint64(100+i)))
		}
		wg.Wait()
		if got := l.Position(); got != mustToken(t, "db", 149) {
			t.Fatalf("Position = %v", got)
		}
	})
}

func TestTokenSink(t *testing.T) {
	var sink TokenSink
	ctx := WithTokenSink(context.Background(), &sink)
	a, b := mustToken(t, "db", 5), mustToken(t, "db", 3)
	if Wrote(ctx, a) != a || Wrote(ctx, b) != b {
		t.Fatal("Wrote does not return its token")
	}
	if sink.Token() != a {
		t.Fatalf("sink holds %v, want the later %v", sink.Token(), a)
	}
	Wrote(context.Background(), a) // no sink: nothing happens
	if _, err := New[int, string](mustGuard(t), GetterFunc[int, string](func(context.Context, int) (string, error) { return "", nil }), WithTokenWait(-1)); err == nil {
		t.Fatal("a negative token wait was taken")
	}
}

func mustGuard(t *testing.T) *guard.Guard {
	t.Helper()
	g, err := guard.New(guard.WithCapacity(100))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}
