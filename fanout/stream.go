package fanout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// errStreamRefused wraps the broker's refusal of the stream's
// configuration: a setup that cannot work, which Relay.Run returns.
var errStreamRefused = errors.New("fanout: the broker refuses the stream's configuration")

// refusal are the codes of the broker's errors that mean the stream cannot
// be made as configured, whatever the retries: an invalid configuration
// (a duplicate window longer than the max age, 10052), replicas in a
// server that is not clustered (10074), subjects that another stream holds
// (10065), and no JetStream (10039, 10076).
var refusal = map[jetstream.ErrorCode]bool{10052: true, 10074: true, 10065: true, 10039: true, 10076: true}

// streamConfig is the configuration of the relay's stream.
func (c *config) streamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: c.stream, Subjects: []string{c.prefix + ".>"}, Storage: c.storage, Replicas: c.replicas,
		MaxAge: c.maxAge, Duplicates: c.duplicates, Discard: jetstream.DiscardOld,
		Description: "cuckooguard: committed changes of guarded PostgreSQL tables, from their relays",
	}
}

// ensureStream makes the stream if it does not exist (a relay's first
// start, or a stream an operator deleted or a broker lost with its
// storage), and returns it. A stream whose configuration this
// relay's would change (another relay's settings) is left as it is. A
// configuration the broker refuses is an errStreamRefused.
func (r *Relay) ensureStream(ctx context.Context) (jetstream.Stream, error) {
	want := r.c.streamConfig()
	s, err := r.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = r.js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = r.js.Stream(ctx, want.Name) // another relay made it first
		}
	}
	if err != nil {
		var api *jetstream.APIError
		if errors.As(err, &api) && refusal[api.ErrorCode] {
			return nil, fmt.Errorf("%w: stream %s: %w", errStreamRefused, want.Name, err)
		}
		return nil, fmt.Errorf("fanout: relay: make stream %s: %w", want.Name, err)
	}
	return s, nil
}

// instanceOf returns the instance of a stream described by si.
func instanceOf(si *jetstream.StreamInfo) instance {
	return instance{name: si.Config.Name, created: si.Created.Round(0)}
}

// holdsAfter reports whether the stream si describes holds every message
// after sequence seq: none of them aged out or purged, and seq not past
// its last (a sequence of a stream made again since).
func holdsAfter(si *jetstream.StreamInfo, seq uint64) bool {
	return seq+1 >= si.State.FirstSeq && seq <= si.State.LastSeq
}

// streamInfo returns the stream's info, fresh from the broker.
func streamInfo(ctx context.Context, js jetstream.JetStream, name string, wait time.Duration) (*jetstream.StreamInfo, error) {
	ictx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	s, err := js.Stream(ictx, name)
	if err != nil {
		return nil, err
	}
	return s.CachedInfo(), nil
}
