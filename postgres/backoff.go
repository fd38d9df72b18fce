package postgres

import (
	"math/rand/v2"
	"time"
)

// MaxBackoff is the longest a Follower waits before it reconnects.
const MaxBackoff = 30 * time.Second

// backoff is the wait before a Follower reconnects. It starts at first
// and doubles after each session that failed, up to max; a session that
// followed for longer than the heartbeat deadline starts it over, so a
// fault after a healthy stretch is met with the first delay again, not
// with the one the last fault left. Each wait is drawn from [d/2, d]
// ("equal jitter"): replicas that lost the database together do not come
// back together, and no wait exceeds max.
type backoff struct {
	first, max time.Duration
	d          time.Duration // the next wait's upper bound
}

func newBackoff(first, max time.Duration) backoff {
	return backoff{first: first, max: max, d: min(first, max)}
}

// next returns the wait before the next reconnect and doubles the bound.
func (b *backoff) next() time.Duration {
	d := b.d
	b.d = min(2*b.d, b.max)
	return d/2 + rand.N(d/2+1)
}

// refused returns the wait before a reconnect after the server refused
// the connection (it is down: restarting, being restored, failing over):
// the first delay, jittered, and the bound is left as it was. A refused
// connection costs the server nothing, and the sooner a follower looks
// once the server is back, the likelier it finds a restored database
// before the restored history's new WAL passes the follower's position
// (decide's "rewound"); doubled waits had reached 2 s in a CI run and
// missed it (TestRestoredDatabase, 821 wrong 404s).
func (b *backoff) refused() time.Duration {
	d := min(b.first, b.max)
	return d/2 + rand.N(d/2+1)
}

// reset starts the waits over from first.
func (b *backoff) reset() {
	b.d = min(b.first, b.max)
}
