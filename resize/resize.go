package resize

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/cuckooguard/cuckooguard/internal/options"
	"github.com/cuckooguard/cuckooguard/shard"
)

// Resizer queues shards that reached the load threshold and doubles them in
// background goroutines. Use [New] to make one.
//
// A Resizer is safe for concurrent use by multiple goroutines and must not
// be copied after first use.
type Resizer struct {
	threshold float64
	chunk     int
	maxBytes  int64 // 0: no cap
	used      atomic.Int64

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
	refused   atomic.Int64
	nanos     atomic.Int64
}

// New returns a Resizer configured by opts. It starts no goroutine: the
// first shard queued starts a dispatcher, which returns once the queue is
// empty, so that an idle guard holds no goroutine (and no stack).
func New(opts ...Option) (*Resizer, error) {
	c := config{threshold: DefaultGrowThreshold, workers: DefaultWorkers(), chunk: shard.DefaultChunk}
	if err := options.Apply("resize: New", &c, opts); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Resizer{
		threshold: c.threshold,
		chunk:     c.chunk,
		maxBytes:  c.maxBytes,
		sem:       semaphore.NewWeighted(int64(c.workers)),
		ctx:       ctx,
		cancel:    cancel,
		queued:    make(map[*shard.Shard]struct{}),
	}
	r.used.Store(c.usedBytes)
	return r, nil
}

// Maybe queues s for a background doubling if its load factor has reached
// the threshold and it is neither doubling nor saturated nor queued. It
// never blocks; writers call it after every insert.
func (r *Resizer) Maybe(s *shard.Shard) {
	if s == nil {
		return
	}
	if s.LoadFactor() < r.threshold || s.Growing() || s.Saturated() {
		return
	}
	if r.maxBytes != 0 && r.used.Load()+int64(s.NextGrowBytes()) > r.maxBytes {
		return // would be refused; GrowNow reports it if the shard fills up
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

// migrate doubles s in chunks until done or Close. A shard that fell below
// the threshold since it was queued, or that another goroutine is already
// doubling, is left alone.
func (r *Resizer) migrate(s *shard.Shard) {
	if s.LoadFactor() < r.threshold || s.Growing() {
		return
	}
	// The sizes are those of the table of doubling d; BeginGrowFrom refuses
	// if a writer doubled the shard since, so the reservation stays right.
	d := s.Doublings()
	need, old := int64(s.NextGrowBytes()), int64(s.TableBytes())
	if !r.reserve(need) {
		r.refused.Add(1)
		return
	}
	began, err := s.BeginGrowFrom(d)
	if err != nil || !began {
		r.used.Add(-need)
		return
	}
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	start := time.Now()
	defer func() { r.nanos.Add(int64(time.Since(start))) }()
	for !s.GrowStep(r.chunk) {
		if r.ctx.Err() != nil {
			// Closed mid-migration: the shard stays readable and the next
			// writer that needs room finishes the doubling.
			return
		}
	}
	// Whoever ran the last step, the doubling we began is done: its old
	// table is garbage now.
	r.used.Add(-old)
	r.completed.Add(1)
}

// GrowNow doubles s in the calling goroutine, as a writer that could not
// place a key needs: if s has finished exactly doublings doublings (the
// count the caller read before its insert failed), it begins a doubling or
// helps finish the one in progress, and returns once no doubling is in
// progress. If another goroutine doubled s meanwhile it returns at once.
// Either way the caller should retry its insert. It returns
// [shard.ErrSaturated] or [ErrMaxBytes] when s cannot double, and [ErrCrowded] when s is less
// than MinGrowLoad full. GrowNow works after Close too.
func (r *Resizer) GrowNow(s *shard.Shard, doublings int) error {
	if s == nil {
		return errors.New("resize: GrowNow needs a shard")
	}
	if s.Doublings() != doublings {
		return nil // doubled meanwhile: no need to reserve memory
	}
	if s.LoadFactor() < MinGrowLoad && !s.Growing() {
		return ErrCrowded
	}
	need, old := int64(s.NextGrowBytes()), int64(s.TableBytes())
	if !r.reserve(need) {
		r.refused.Add(1)
		return ErrMaxBytes
	}
	start := time.Now()
	began, err := s.BeginGrowFrom(doublings)
	if err != nil {
		r.used.Add(-need)
		return err
	}
	// Run the doubling we began, or help finish the one in progress.
	for !s.GrowStep(r.chunk) {
	}
	if !began {
		r.used.Add(-need)
		return nil
	}
	r.nanos.Add(int64(time.Since(start)))
	r.used.Add(-old)
	r.completed.Add(1)
	return nil
}

// reserve adds n bytes to the memory in use and reports whether that stays
// within the cap.
func (r *Resizer) reserve(n int64) bool {
	for {
		used := r.used.Load()
		if r.maxBytes != 0 && used+n > r.maxBytes {
			return false
		}
		if r.used.CompareAndSwap(used, used+n) {
			return true
		}
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
	Completed   int64         // doublings finished (background and GrowNow)
	Refused     int64         // doublings refused by the memory cap
	TimeGrowing time.Duration // total time spent doubling
	UsedBytes   int64         // memory accounted against the cap
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
		Refused:     r.refused.Load(),
		TimeGrowing: time.Duration(r.nanos.Load()),
		UsedBytes:   r.used.Load(),
	}
}
