package guarded

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTokenWait is how long a lookup that carries a [Token] waits, at
// most, for the Loader's change stream to reach it before it passes
// through to the store (see [WithTokenWait]).
const DefaultTokenWait = 50 * time.Millisecond

// A Token names a write's place in the store's change stream: the stream
// (for PostgreSQL, the database: its cluster's system identifier and its
// oid) and a position in it at or after the write's commit. A write
// returns one (package postgres's CommitToken, pgguard's Table.Insert);
// the client carries it to its next request, to whichever replica that
// reaches (the middleware's response header or cookie, rpcguard's
// metadata); a lookup made under it ([WithToken]) is answered "absent" by
// a Loader only once the Loader's stream has applied every change up to
// the token's position ([Feed.Reached]), so that a client reads its own
// writes on every replica. A Loader whose stream is behind waits for it,
// up to [WithTokenWait], and then passes the lookup through to the store;
// a token of another stream passes through at once. A lookup without a
// token is answered as before and pays nothing for the feature.
//
// Its text ([Token.String], [ParseToken]) is "<stream>.<position in
// hexadecimal>", letters, digits, "_", "-" and ".", safe in an HTTP
// header, a cookie and gRPC metadata. The zero Token is no token.
type Token struct {
	stream string
	pos    uint64
}

// maxStream bounds a token's stream name, so that a token from a client
// costs little to parse and compare.
const maxStream = 64

// NewToken returns the token of position pos in stream, a name of 1 to 64
// letters, digits, "_" and "-".
func NewToken(stream string, pos uint64) (Token, error) {
	if err := checkStream(stream); err != nil {
		return Token{}, err
	}
	return Token{stream: stream, pos: pos}, nil
}

func checkStream(stream string) error {
	if stream == "" || len(stream) > maxStream {
		return fmt.Errorf("guarded: a token's stream must be 1 to %d characters, not %d", maxStream, len(stream))
	}
	for i := 0; i < len(stream); i++ {
		c := stream[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("guarded: a token's stream %q has %q: only letters, digits, _ and - are allowed", stream, c)
		}
	}
	return nil
}

// ParseToken reads a token's text ([Token.String]). It returns an error,
// saying what is wrong, for any other text.
func ParseToken(s string) (Token, error) {
	if len(s) > maxStream+1+16 {
		return Token{}, fmt.Errorf("guarded: a token is at most %d characters, not %d", maxStream+1+16, len(s))
	}
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return Token{}, errors.New("guarded: a token is <stream>.<position in hexadecimal>: no '.'")
	}
	if err := checkStream(s[:i]); err != nil {
		return Token{}, err
	}
	hex := s[i+1:]
	if hex == "" || len(hex) > 16 || strings.IndexFunc(hex, func(r rune) bool { return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') }) >= 0 {
		return Token{}, fmt.Errorf("guarded: a token's position %q is not 1 to 16 lower-case hexadecimal digits", hex)
	}
	pos, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return Token{}, fmt.Errorf("guarded: a token's position %q: %w", hex, err)
	}
	return Token{stream: s[:i], pos: pos}, nil
}

// String returns the token's text, which [ParseToken] reads; "" for the
// zero Token.
func (t Token) String() string {
	if t.IsZero() {
		return ""
	}
	return t.stream + "." + strconv.FormatUint(t.pos, 16)
}

// Stream returns the name of the token's stream.
func (t Token) Stream() string { return t.stream }

// Pos returns the token's position in its stream.
func (t Token) Pos() uint64 { return t.pos }

// IsZero reports whether t is no token.
func (t Token) IsZero() bool { return t.stream == "" }

// Later returns the later of t and o: o if t is zero, t if o is zero or of
// another stream. A client that made several writes carries the later.
func (t Token) Later(o Token) Token {
	if t.IsZero() || (o.stream == t.stream && o.pos > t.pos) {
		return o
	}
	return t
}

type tokenKey struct{}

// tokensUsed is set once any context carries a token: until then, a
// lookup does not look for one (a context's Value walks its chain).
var tokensUsed atomic.Bool

// WithToken returns a context that carries t: lookups made under it (Get,
// GetMany, [Loader.MayContainContext]) are answered "absent" only once
// the Loader's stream has reached t (see [Token]). The zero Token returns
// ctx itself.
func WithToken(ctx context.Context, t Token) context.Context {
	if t.IsZero() {
		return ctx
	}
	tokensUsed.Store(true)
	return context.WithValue(ctx, tokenKey{}, t)
}

// unreadable is the token of a lookup whose client sent a token that
// could not be read: of no stream, so every lookup under it passes
// through (see WithUnreadableToken).
var unreadable = Token{stream: " "}

// WithUnreadableToken returns a context under which lookups pass through
// to the store, counted as of another stream (Stats.TokenForeign): the
// request carried a token that [ParseToken] refused, so whatever write it
// names cannot be waited for. The fronts (the HTTP middleware, rpcguard)
// use it; a lookup under it is never answered "absent" by the guard.
func WithUnreadableToken(ctx context.Context) context.Context {
	tokensUsed.Store(true)
	return context.WithValue(ctx, tokenKey{}, unreadable)
}

// TokenFrom returns the token ctx carries (see [WithToken]).
func TokenFrom(ctx context.Context) (Token, bool) {
	if !tokensUsed.Load() {
		return Token{}, false
	}
	t, ok := ctx.Value(tokenKey{}).(Token)
	return t, ok
}

// A TokenSink collects the tokens of the writes made under a context
// ([WithTokenSink]): the HTTP middleware and rpcguard put one in a
// request's context, and send what it holds when the handler is done, so
// that a handler's writes ([Wrote]) reach the client without the handler
// passing them on.
type TokenSink struct {
	mu sync.Mutex
	t  Token
}

// Token returns the latest token the sink collected, or the zero Token.
func (s *TokenSink) Token() Token {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.t
}

type sinkKey struct{}

// WithTokenSink returns a context that collects, in s, the tokens that
// [Wrote] records under it.
func WithTokenSink(ctx context.Context, s *TokenSink) context.Context {
	return context.WithValue(ctx, sinkKey{}, s)
}

// Wrote records t, the token of a write made under ctx, in the context's
// [TokenSink], if it has one (keeping the later of the sink's tokens, see
// [Token.Later]), and returns t. Writes that return a token (pgguard's
// Table.Insert and Table.Delete) call it.
func Wrote(ctx context.Context, t Token) Token {
	if s, ok := ctx.Value(sinkKey{}).(*TokenSink); ok && !t.IsZero() {
		s.mu.Lock()
		s.t = s.t.Later(t)
		s.mu.Unlock()
	}
	return t
}

// WithTokenWait sets how long a lookup that carries a [Token] waits, at
// most, for the Loader's stream to reach it before it passes through to
// the store. 0 passes it through at once; the default is
// [DefaultTokenWait]. A replica's stream is usually a few milliseconds
// behind a write; it can be the stream's max lag behind (a relay's
// takeover, a broker's restart).
func WithTokenWait(d time.Duration) Option {
	return func(c *config) { c.tokenWait = d }
}

// reach is how far a Loader's stream has applied its store's changes:
// [Feed.Reached]. The stream goroutine writes it; lookups read it and
// wait on it.
type reach struct {
	stream  atomic.Pointer[string]
	pos     atomic.Uint64
	waiters atomic.Int32
	mu      sync.Mutex
	moved   chan struct{} // closed when pos moves while waiters > 0; under mu
}

// set records that the guard holds every change of stream up to pos.
func (r *reach) set(stream string, pos uint64) {
	if s := r.stream.Load(); s == nil || *s != stream {
		r.stream.Store(&stream)
	}
	r.pos.Store(pos)
	if r.waiters.Load() > 0 {
		r.mu.Lock()
		if r.moved != nil {
			close(r.moved)
			r.moved = nil
		}
		r.mu.Unlock()
	}
}

// clear forgets the position: a detached feed's Loader has none.
func (r *reach) clear() {
	r.stream.Store(nil)
	r.pos.Store(0)
}

// has reports whether the stream has reached t, and whether t is of
// another stream (or the Loader's stream reported none).
func (r *reach) has(t Token) (reached, foreign bool) {
	s := r.stream.Load()
	if s == nil || *s != t.stream {
		return false, true
	}
	return r.pos.Load() >= t.pos, false
}

// wait waits until the stream reaches t, for d at most, or until ctx
// ends, and reports whether it did.
func (r *reach) wait(ctx context.Context, t Token, d time.Duration) bool {
	if reached, foreign := r.has(t); reached || foreign || d <= 0 {
		return reached
	}
	r.waiters.Add(1)
	defer r.waiters.Add(-1)
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		r.mu.Lock()
		if r.moved == nil {
			r.moved = make(chan struct{})
		}
		moved := r.moved
		r.mu.Unlock()
		// After taking the channel: a set that stored its position before
		// this read closes this channel or a later one, or is seen here.
		if reached, foreign := r.has(t); reached || foreign {
			return reached
		}
		select {
		case <-moved:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// afterToken judges the token ctx carries, if any, before a lookup reads
// the guard: it reports false if the lookup must pass through to the
// store (the stream has not reached the token within the wait, or the
// token is of another stream), after waiting for the stream if it is
// behind. A Loader that is not ready passes lookups through anyway and
// does not wait.
func (l *Loader[K, V]) afterToken(ctx context.Context) bool {
	t, ok := TokenFrom(ctx)
	if !ok {
		return true
	}
	l.tokenLookups.Inc()
	reached, foreign := l.reach.has(t)
	switch {
	case reached:
		return true
	case foreign:
		l.tokenForeign.Inc()
		return false
	case !l.ready.ready():
		return false // it passes through anyway
	}
	l.tokenWaits.Inc()
	if l.reach.wait(ctx, t, l.cfg.tokenWait) {
		return true
	}
	l.tokenPassed.Inc()
	return false
}

// Position returns how far the Loader's stream has applied the store's
// changes ([Feed.Reached]), as a token: a lookup under a token at or
// before it does not wait. The zero Token if the stream reported none.
func (l *Loader[K, V]) Position() Token {
	s := l.reach.stream.Load()
	if s == nil {
		return Token{}
	}
	return Token{stream: *s, pos: l.reach.pos.Load()}
}

// reached is Feed.Reached's part in the Loader.
func (l *Loader[K, V]) reached(t Token) { l.reach.set(t.stream, t.pos) }
