package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// consumerInactive is how long the broker keeps a follower's consumer
// that nobody pulls from: a process that dies leaves none behind for
// longer.
const consumerInactive = 5 * time.Second

// consumer delivers a subject's messages from a Follower's position, on
// a goroutine of its own: the session's loop watches the lag whatever the
// consumer does.
type consumer struct {
	msgs chan jetstream.Msg
	errs chan error
	stop func()
}

// consume makes an ephemeral consumer of subject from the message after
// the position, and proves that it starts there: the stream is still the
// position's instance, and holds every message after the position (a
// consumer asked to start at a sequence the stream no longer holds starts
// at the first one it holds). Otherwise the table is read.
func (f *Follower[K]) consume(ctx context.Context, subject string) (*consumer, error) {
	p := &f.pos
	name := fmt.Sprintf("cg_%s_%x", Token(f.c.origin), rand.Uint64())
	cctx, cancel := context.WithTimeout(ctx, f.c.deadline)
	defer cancel()
	cons, err := f.js.CreateConsumer(cctx, p.in.name, jetstream.ConsumerConfig{
		Name: name, FilterSubject: subject + ".>", DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: p.seq + 1,
		AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: consumerInactive, MemoryStorage: true, Replicas: 1,
	})
	if err != nil {
		return nil, &failure{failStream, fmt.Errorf("fanout: follower: consume %s: %w", subject, err)}
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), closeWait)
		defer cancel()
		f.js.DeleteConsumer(dctx, p.in.name, name) // best effort: it goes by itself when inactive
	}
	si, err := streamInfo(ctx, f.js, p.in.name, f.c.deadline)
	if err != nil {
		drop()
		return nil, &failure{failStream, fmt.Errorf("fanout: follower: stream %s: %w", p.in.name, err)}
	}
	why := ""
	switch {
	case !instanceOf(si).same(p.in):
		why = readStream
	case !holdsAfter(si, p.seq):
		why = readGap
	}
	if why != "" {
		drop()
		f.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: fanout follower's stream no longer holds every message after its place; it reads the table",
			slog.Uint64("seq", p.seq), slog.Uint64("stream_first", si.State.FirstSeq), slog.Uint64("stream_last", si.State.LastSeq),
			slog.String("stream", instanceOf(si).String()), slog.String("was", p.in.String()))
		return nil, &reread{why}
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(512), jetstream.PullExpiry(5*time.Second), jetstream.PullHeartbeat(time.Second),
		jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		drop()
		return nil, &failure{failStream, fmt.Errorf("fanout: follower: consume %s: %w", subject, err)}
	}
	// Buffered: the consumer runs ahead of the session, one handoff per
	// batch of messages rather than per message.
	c := &consumer{msgs: make(chan jetstream.Msg, 256), errs: make(chan error, 1)}
	gctx, gcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			m, err := iter.Next(jetstream.NextContext(gctx))
			if err != nil {
				if gctx.Err() == nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					c.errs <- err
				} else if gctx.Err() == nil {
					c.errs <- errors.New("the consumer stopped")
				}
				return
			}
			select {
			case c.msgs <- m:
			case <-gctx.Done():
				return
			}
		}
	})
	c.stop = func() {
		gcancel()
		iter.Stop()
		wg.Wait()
		drop()
	}
	return c, nil
}

// closeWait bounds the goodbyes to a server, on the way out.
const closeWait = 250 * time.Millisecond
