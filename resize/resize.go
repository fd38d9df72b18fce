package resize

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/cuckooguard/cuckooguard/internal/options"
	"github.com/cuckooguard/cuckooguard/shard"
)

// Resizer doubles, in background goroutines, the shards that writers hand
// it once their growth policy says they need it ([shard.Shard.NeedsGrowth]).
// Use [New] to make one.
//
// A Resizer is safe for concurrent use by multiple goroutines and must not
// be copied after first use.
type Resizer struct {
	chunk int

	sem    *semaphore.Weighted
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // dispatcher and migrations
	once   sync.Once

	mu          sync.Mutex // protects queue, queued and dispatching, and orders wg.Add before Close's Wait
	queue       []*shard.Shard
	queued      map[*shard.Shard]struct{}
	dispatching bool // a dispatcher goroutine runs; it stops when the queue is empty

	inFlight  atomic.Int64
	completed atomic.Int64
	nanos     atomic.Int64
}

// New returns a Resizer configured by opts. It starts no goroutine: the
// first shard queued starts a dispatcher, which returns once the queue is
// empty, so that an idle guard holds no goroutine (and no stack).
func New(opts ...Option) (*Resizer, error) {
	c := config{workers: DefaultWorkers(), chunk: shard.DefaultChunk}
	if err := options.Apply("resize: New", &c, opts); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Resizer{
		chunk:  c.chunk,
		sem:    semaphore.NewWeighted(int64(c.workers)),
		ctx:    ctx,
		cancel: cancel,
		queued: make(map[*shard.Shard]struct{}),
	}, nil
}

// Maybe queues s for a background doubling if it needs one
// ([shard.Shard.NeedsGrowth]: past its growth policy's threshold, not
// doubling, room under the memory cap) and is not queued. It never
// blocks; writers call it after every insert.
func (r *Resizer) Maybe(s *shard.Shard) {
	if s == nil || !s.NeedsGrowth() {
		return
	}
	r.mu.Lock()
	if _, ok := r.queued[s]; ok || r.ctx.Err() != nil {
		r.mu.Unlock()
		return
	}
	r.queued[s] = struct{}{}
	r.queue = append(r.queue, s)
	if !r.dispatching {
		r.dispatching = true
		r.wg.Add(1) // under mu, which Close takes to cancel: never after its Wait began
		go r.dispatch()
	}
	r.mu.Unlock()
}

// dispatch starts a migration for each queued shard, at most the worker
// bound at a time, and returns when the queue is empty or at Close.
func (r *Resizer) dispatch() {
	defer r.wg.Done()
	for {
		s := r.pop()
		if s == nil {
			return
		}
		if err := r.sem.Acquire(r.ctx, 1); err != nil {
			return // closed
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.sem.Release(1)
			r.migrate(s)
		}()
	}
}

// pop takes the first queued shard; if there is none, the dispatcher
// stops, in the same critical section, so that the next Maybe starts one.
func (r *Resizer) pop() *shard.Shard {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.queue) == 0 || r.ctx.Err() != nil {
		r.dispatching = false
		return nil
	}
	s := r.queue[0]
	r.queue[0] = nil
	r.queue = r.queue[1:]
	delete(r.queued, s)
	return s
}

// migrate doubles s in chunks until done or Close. A shard that no longer
// needs it when its turn comes (a writer doubled it, or the memory cap has
// no room now) is left alone: its first step does nothing.
func (r *Resizer) migrate(s *shard.Shard) {
	d := s.Doublings()
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	start := time.Now()
	for !s.GrowStep(r.chunk) {
		if r.ctx.Err() != nil {
			// Closed mid-migration: the shard stays readable and the next
			// writer that needs room finishes the doubling.
			return
		}
	}
	if s.Doublings() != d {
		r.nanos.Add(int64(time.Since(start)))
		r.completed.Add(1)
	}
}

// Close stops the dispatcher and every migration and waits for them to
// return. A migration stopped half way leaves its shard readable and
// writable. Close is idempotent, safe to call concurrently, and returns nil.
func (r *Resizer) Close() error {
	r.once.Do(func() {
		r.mu.Lock()
		r.cancel()
		clear(r.queued)
		r.queue = nil
		r.mu.Unlock()
	})
	r.wg.Wait()
	return nil
}

// Stats describes a Resizer. Its fields are read one by one and do not
// necessarily form a consistent snapshot.
type Stats struct {
	Queued      int           // shards waiting for a worker
	InFlight    int           // migrations running in the background
	Completed   int64         // doublings the workers ran (writers may have helped finish them)
	TimeGrowing time.Duration // total time the workers spent doubling
}

// Stats returns the Resizer's statistics.
func (r *Resizer) Stats() Stats {
	r.mu.Lock()
	q := len(r.queue)
	r.mu.Unlock()
	return Stats{
		Queued:      q,
		InFlight:    int(r.inFlight.Load()),
		Completed:   r.completed.Load(),
		TimeGrowing: time.Duration(r.nanos.Load()),
	}
}
