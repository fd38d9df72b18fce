package fanout

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/cuckooguard/cuckooguard/internal/options"
)

// Teardown removes everything a relayed service named relay made for its
// tables, in db and on the NATS server nc reaches: what the relay made in
// the database (for PostgreSQL, the tables' publications and their rows in
// cuckooguard_slots, as postgres.Unpublish, which also drops direct
// followers' slots, and the relay's replication slot), the relay's messages in the stream and the
// consumers that read them, and its saved guards; the stream and the
// bucket themselves once nothing else is left in them (several services
// and databases may share them). Stop the service's relays and followers
// first: a relay that runs on makes its slot and its stream again. Of the
// options, WithStream, WithSubjectPrefix and WithSnapshots (its bucket)
// apply; give the ones the service used.
func Teardown(ctx context.Context, db follow.Database, nc *nats.Conn, relay string, tables []string, opts ...Option) error {
	c := defaults()
	if err := options.Apply("fanout: Teardown", &c, opts); err != nil {
		return err
	}
	if ctx == nil || db == nil || nc == nil || relay == "" {
		return errors.New("fanout: Teardown needs a context, a database, a NATS connection and the relay's name")
	}
	origin, err := db.Teardown(ctx, relay, tables)
	if err != nil {
		return fmt.Errorf("fanout: teardown: %w", err)
	}
	return TeardownStream(ctx, origin, nc, relay, opts...)
}

// TeardownStream removes, on the NATS server nc reaches, what a relayed
// service named relay left of the database origin: the relay's messages in
// the stream and the consumers that read them, and its saved guards; the
// stream and the bucket themselves once nothing else is left in them. It
// is Teardown's part on the broker, for a caller that removed what the
// relay made in the database itself (postgres.TeardownRelay). Of the
// options, WithStream, WithSubjectPrefix and WithSnapshots apply.
func TeardownStream(ctx context.Context, origin follow.Origin, nc *nats.Conn, relay string, opts ...Option) error {
	c := defaults()
	if err := options.Apply("fanout: TeardownStream", &c, opts); err != nil {
		return err
	}
	if ctx == nil || origin.IsZero() || nc == nil || relay == "" {
		return errors.New("fanout: TeardownStream needs a context, a database's origin, a NATS connection and the relay's name")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("fanout: teardown: %w", err)
	}
	stem := route{db: origin, relay: Token(relay)} // no table: the prefix of every table's names
	if err := teardownStream(ctx, js, c.stream, stem.subject(c.prefix)); err != nil {
		return err
	}
	if c.bucket != "" {
		return teardownBucket(ctx, js, c.bucket, stem.object())
	}
	return nil
}

// teardownStream purges the messages under subject prefix p from stream
// name, deletes the consumers of them, and deletes the stream if it is
// left with no message and no consumer.
func teardownStream(ctx context.Context, js jetstream.JetStream, name, p string) error {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fanout: teardown: stream %s: %w", name, err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(p+">")); err != nil {
		return fmt.Errorf("fanout: teardown: purge %s>: %w", p, err)
	}
	others := 0
	for ci := range s.ListConsumers(ctx).Info() {
		if strings.HasPrefix(ci.Config.FilterSubject, p) {
			if err := s.DeleteConsumer(ctx, ci.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("fanout: teardown: delete consumer %s: %w", ci.Name, err)
			}
			continue
		}
		others++
	}
	si, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("fanout: teardown: stream %s: %w", name, err)
	}
	if si.State.Msgs == 0 && others == 0 {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("fanout: teardown: delete stream %s: %w", name, err)
		}
	}
	return nil
}

// teardownBucket deletes the objects whose names begin with p from
// bucket, and the bucket if nothing else is left in it.
func teardownBucket(ctx context.Context, js jetstream.JetStream, bucket, p string) error {
	obs, err := js.ObjectStore(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fanout: teardown: bucket %s: %w", bucket, err)
	}
	infos, err := obs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return fmt.Errorf("fanout: teardown: list bucket %s: %w", bucket, err)
	}
	others := 0
	for _, info := range infos {
		if !strings.HasPrefix(info.Name, p) {
			others++
			continue
		}
		if err := obs.Delete(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("fanout: teardown: delete %s from %s: %w", info.Name, bucket, err)
		}
	}
	if others == 0 {
		if err := js.DeleteObjectStore(ctx, bucket); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("fanout: teardown: delete bucket %s: %w", bucket, err)
		}
	}
	return nil
}
