package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cuckooguard/cuckooguard/follow"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// session is one session of a Follower: connect, start from where the
// guard stands (or from a saved guard, or a read of the table), consume
// the table's subject from the next sequence, and apply it, with a
// heartbeat through the database and the relay, and the lag judged on this
// process's clock whether messages come or not.
func (f *Follower[K]) session(ctx context.Context) (followed time.Duration, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	requests := f.feed.Requests()
	go func() {
		select {
		case <-requests:
			cancel(&reread{readRequest})
		case <-ctx.Done():
		}
	}()
	defer func() {
		if c := context.Cause(ctx); c != nil && c != context.Canceled {
			var re *reread
			if errors.As(c, &re) {
				err = c
			}
		}
	}()
	// A closed or reconnecting NATS connection is not a silent fault: the
	// session ends at once, and the Loader passes through.
	status := f.nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	defer f.nc.RemoveStatusListener(status)
	if !f.nc.IsConnected() {
		return 0, &failure{failNATS, fmt.Errorf("fanout: follower: the NATS connection is %s", f.nc.Status())}
	}
	cctx, ccancel := context.WithTimeout(ctx, f.c.deadline)
	conn, err := f.db.Connect(cctx, f.table, f.key)
	ccancel()
	if err != nil {
		if f.db.Permanent(err) {
			return 0, &failure{failSetup, fmt.Errorf("fanout: follower: %w", err)}
		}
		return 0, &failure{failDatabase, fmt.Errorf("fanout: follower: connect: %w", err)}
	}
	defer conn.Close()
	rt, in, err := f.locate(ctx, conn)
	if err != nil {
		return 0, err
	}
	form, err := conn.KeyForm(ctx, f.tags.Form()) // Key's forms, before the Loader can be ready
	if err != nil {
		return 0, &failure{failSetup, err}
	}
	f.tags.SetForm(form)
	f.state.Store(int32(follow.Resyncing))
	if !f.pos.valid {
		if f.pending == readStart {
			if err := f.restore(ctx, in, rt); err != nil {
				f.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: fanout follower cannot start from a saved guard; it reads the table", slog.Any("error", err))
			}
		}
		if !f.pos.valid {
			p, found, err := f.place(ctx, in, rt)
			if err != nil {
				return 0, err
			}
			if found {
				err = f.read(ctx, conn, p)
			} else {
				p.valid, p.unread = true, true
				f.pos = p
			}
			if err != nil {
				return 0, err
			}
		}
	}
	subject := rt.subject(f.c.prefix)
	cons, err := f.consume(ctx, subject)
	if err != nil {
		return 0, err
	}
	defer cons.stop()
	s := &fsession[K]{f: f, token: fmt.Sprintf("%x", rand.Uint64()), send: make(chan string, 2)}
	sctx, endSend := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer endSend(nil)
	// Each marker and heartbeat carries the identity of the table that
	// its own transaction finds under the name (follow.Session.Emit),
	// which the relay passes on with the identity of the table it streams:
	// control takes it as evidence only when the two are equal.
	emit := func(payload string) error {
		ectx, cancel := context.WithTimeout(sctx, f.c.deadline)
		defer cancel()
		return conn.Emit(ectx, rt.control(), payload)
	}
	s.markerSent = time.Now()
	if err := emit("S " + s.token); err != nil {
		return 0, &failure{failDatabase, fmt.Errorf("fanout: follower: send the marker: %w", err)}
	}
	s.next = s.markerSent.Add(f.c.heartbeat)
	wg.Go(func() {
		for {
			select {
			case <-sctx.Done():
				return
			case p := <-s.send:
				if err := emit(p); err != nil {
					endSend(&failure{failDatabase, fmt.Errorf("fanout: follower: send a heartbeat: %w", err)})
					return
				}
			}
		}
	})
	lastSave := time.Now()
	timer := time.NewTimer(f.c.heartbeat)
	defer timer.Stop()
	for {
		var msgErr error
		select {
		case <-ctx.Done():
			return s.followed(time.Now()), context.Cause(ctx)
		case <-sctx.Done():
			return s.followed(time.Now()), context.Cause(sctx)
		case st := <-status:
			return s.followed(time.Now()), &failure{failNATS, fmt.Errorf("fanout: follower: the NATS connection is %s", st)}
		case err := <-cons.errs:
			return s.followed(time.Now()), &failure{failStream, fmt.Errorf("fanout: follower: consume %s: %w", subject, err)}
		case msg := <-cons.msgs:
			msgErr = s.handle(ctx, msg, time.Now())
		case <-timer.C:
		}
		now := time.Now()
		if msgErr != nil {
			return s.followed(now), msgErr
		}
		s.tick(now)
		if f.c.snapWhen != nil && s.partial == nil && f.pos.skip == nil && !f.pos.unread && follow.State(f.state.Load()) == follow.Following &&
			now.Sub(lastSave) >= f.c.snapEvery && f.c.snapWhen() {
			lastSave = now
			if err := f.save(ctx, rt); err != nil {
				f.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: fanout follower could not save its guard", slog.Any("error", err))
			}
		}
		timer.Reset(max(s.wake(now), time.Millisecond))
	}
}

// locate finds the table's subject and the stream's instance, and drops
// the position if it is not in them: the database or the stream is
// another one.
func (f *Follower[K]) locate(ctx context.Context, conn follow.Session) (route, instance, error) {
	db, err := conn.Origin(ctx)
	if err != nil {
		return route{}, instance{}, &failure{failDatabase, err}
	}
	if !f.origin.IsZero() && !f.origin.Same(db) {
		f.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: fanout follower's connection reaches another database than before; it reads the table",
			slog.String("was", f.origin.String()), slog.String("now", db.String()))
		f.pos.valid = false
		f.pending = readStream
	}
	f.origin = db
	rt := route{db: db, relay: f.relay, table: Token(conn.Table())}
	si, err := streamInfo(ctx, f.js, f.c.stream, f.c.deadline)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return rt, instance{}, &failure{failSetup, fmt.Errorf("fanout: follower: stream %s not found (is the relay running?): %w", f.c.stream, err)}
	case err != nil:
		return rt, instance{}, &failure{failStream, fmt.Errorf("fanout: follower: stream %s: %w", f.c.stream, err)}
	}
	in := instanceOf(si)
	if f.pos.valid && !f.pos.in.same(in) {
		f.c.logger.LogAttrs(ctx, slog.LevelWarn, "cuckooguard: fanout follower's stream was deleted and made again; it reads the table",
			slog.String("was", f.pos.in.String()), slog.String("now", in.String()))
		f.pos.valid = false
		f.pending = readStream
	}
	return rt, in, nil
}
