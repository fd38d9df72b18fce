package runset

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

// A Table is what a table of a guarded service needs for its Loader: the
// fields of pgguard.Table and mysqlguard.Table that do not depend on the
// database.
type Table[K comparable, V any] struct {
	Name     string
	Get      func(ctx context.Context, key K) (V, error)
	NotFound func(error) bool // nil: notFound of NewLoader
	Capacity int              // 0: estimate of NewLoader
	Options  []guarded.Option
}

// NewLoader makes t's Loader for package what ("pgguard"): a guard sized
// for t.Capacity keys, or, where that is 0, for estimate's; t.Get behind
// it; t.NotFound (or notFound) and log, and t.Options after them, which
// may override them.
func NewLoader[K comparable, V any](ctx context.Context, what string, t Table[K, V], notFound func(error) bool,
	estimate func(context.Context) (int, error), log *slog.Logger) (*guarded.Loader[K, V], error) {
	if t.Get == nil {
		return nil, fmt.Errorf("%s: table %s has no Get", what, t.Name)
	}
	if t.NotFound != nil {
		notFound = t.NotFound
	}
	capacity := t.Capacity
	if capacity == 0 {
		var err error
		if capacity, err = estimate(ctx); err != nil {
			return nil, err
		}
	}
	g, err := guard.New(guard.WithCapacity(capacity))
	if err != nil {
		return nil, fmt.Errorf("%s: table %s: %w", what, t.Name, err)
	}
	opts := append([]guarded.Option{guarded.WithNotFound(notFound), guarded.WithLogger(log)}, t.Options...)
	l, err := guarded.New(g, guarded.GetterFunc[K, V](t.Get), opts...)
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("%s: table %s: %w", what, t.Name, err)
	}
	return l, nil
}

// ParseFor returns parse, or else the parse of K among more (each a
// func(string) (T, error): a database's own key types), or else that of
// the key types that need none: string and the integers. A key type with
// none of these is an error.
func ParseFor[K comparable](parse func(string) (K, error), more ...any) (func(string) (K, error), error) {
	if parse != nil {
		return parse, nil
	}
	for _, p := range more {
		if p, ok := p.(func(string) (K, error)); ok {
			return p, nil
		}
	}
	var zero K
	var p any
	switch any(zero).(type) {
	case string:
		p = func(s string) (string, error) { return s, nil }
	case int64:
		p = func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
	case int32:
		p = func(s string) (int32, error) { n, err := strconv.ParseInt(s, 10, 32); return int32(n), err }
	case int:
		p = func(s string) (int, error) { n, err := strconv.ParseInt(s, 10, 64); return int(n), err }
	case uint64:
		p = func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) }
	case uint32:
		p = func(s string) (uint32, error) { n, err := strconv.ParseUint(s, 10, 32); return uint32(n), err }
	default:
		return nil, fmt.Errorf("keys of type %T need a Parse", zero)
	}
	return p.(func(string) (K, error)), nil
}

// RelayedWhy says why a table whose follower follows a relay (package
// fanout) is not ready, from the follower's stats.
func RelayedWhy(natsConnected bool, state follow.State, relaySilence, lag time.Duration, lastErr error) string {
	switch {
	case !natsConnected:
		return "NATS connection down"
	case state == follow.Behind && relaySilence > time.Second:
		return fmt.Sprintf("relay silent for %v", relaySilence.Round(time.Millisecond))
	case state == follow.Behind:
		return fmt.Sprintf("follower behind (lag %v)", lag.Round(time.Millisecond))
	case lastErr != nil && state == follow.PassThrough:
		return fmt.Sprintf("follower %s: %v", state, lastErr)
	}
	return "follower " + state.String()
}
