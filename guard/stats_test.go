package guard

import (
	"bytes"
	"fmt"
	"reflect"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/internal/memsize"
)

// TestStatsBytesMatchHeap holds Stats().Bytes to the heap a guard takes,
// measured as the growth of the live heap while guards are held: within 5%,
// for guards sized for 1,000 keys to 1M, empty and at capacity, and at
// points of a guard's growth. WithMaxBytes caps what Stats().Bytes counts,
// so this is what makes the cap a cap.
func TestStatsBytesMatchHeap(t *testing.T) {
	if p, n := runtime.GOMAXPROCS(0), runtime.NumCPU(); p > n {
		// More Ps than cores (go test -cpu 8 on a 2-core machine): the
		// runtime starts threads as background doublings wait for a core,
		// and keeps their structures on the heap, 1-6% of these small
		// guards, none of it the guard's.
		t.Skipf("GOMAXPROCS %d > %d cores: the runtime's threads would be measured as the guard's heap", p, n)
	}
	// What the first guard of a process allocates once (pools, the
	// runtime's timers) is no guard's memory.
	warm, err := New(WithCapacity(1000))
	if err != nil {
		t.Fatal(err)
	}
	_ = warm.AddString("warm")
	warm.Close()

	caps := []int{1000, 10_000, 100_000, 1_000_000}
	if testing.Short() {
		caps = caps[:3]
	}
	for _, c := range caps {
		for _, fill := range []bool{false, true} {
			t.Run(fmt.Sprintf("capacity=%d/filled=%v", c, fill), func(t *testing.T) {
				n := max(1, 200_000/c) // guards, so that small ones rise above the noise
				keys := 0
				if fill {
					keys = c
				}
				gs := make([]*Guard, n)
				before := memsize.LiveHeap()
				for i := range gs {
					g, err := New(WithCapacity(c), WithSeed(uint64(i)))
					if err != nil {
						t.Fatal(err)
					}
					for k := range keys {
						if err := g.AddString(fmt.Sprint(k)); err != nil {
							t.Fatal(err)
						}
					}
					gs[i] = g
				}
				heap := memsize.LiveHeap() - before
				stats := 0
				for _, g := range gs {
					stats += g.Stats().Bytes
				}
				for _, g := range gs {
					g.Close()
				}
				t.Logf("%d guards: heap %d, Stats().Bytes %d: %.3f", n, heap, stats, float64(stats)/float64(heap))
				checkBytes(t, stats, heap)
			})
		}
	}
	t.Run("growth", func(t *testing.T) {
		// Background doublings make the runtime start threads and
		// goroutines, whose structures it keeps on the heap for reuse
		// (runtime.allocm, the free goroutine lists): about 60 KB with 8
		// Ps, none of it the guard's. A first growth pays for them.
		warm, err := New(WithCapacity(1000), WithSeed(2))
		if err != nil {
			t.Fatal(err)
		}
		for k := range 100_000 {
			if err := warm.AddString(fmt.Sprint(k)); err != nil {
				t.Fatal(err)
			}
		}
		warm.Close()
		before := memsize.LiveHeap()
		g, err := New(WithCapacity(1000), WithSeed(1))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		for k := range 300_000 {
			if err := g.AddString(fmt.Sprint(k)); err != nil {
				t.Fatal(err)
			}
			if (k+1)%50_000 == 0 {
				// A doubling the resizer is running holds both tables,
				// and Stats counts both; wait, so that the heap is read
				// with no table being allocated.
				for st := g.Stats(); st.MigrationsInFlight+st.MigrationsQueued > 0; st = g.Stats() {
					time.Sleep(time.Millisecond)
				}
				heap := memsize.LiveHeap() - before
				st := g.Stats()
				t.Logf("%d keys: heap %d, Stats().Bytes %d", k+1, heap, st.Bytes)
				checkBytes(t, st.Bytes, heap)
			}
		}
	})
}

func checkBytes(t *testing.T, stats int, heap int64) {
	t.Helper()
	if r := float64(stats) / float64(heap); r < 0.95 || r > 1.05 {
		t.Errorf("Stats().Bytes %d, heap %d: ratio %.3f, want within 5%%", stats, heap, r)
	}
}

// TestShardStatsMirrorsShard: every field of shard.Stats has a field of
// the same name and value in guard's ShardStats, so that shardStats
// forgets none when package shard adds one.
func TestShardStatsMirrorsShard(t *testing.T) {
	g := mustNew(t, WithCapacity(1000), WithShards(2))
	for i := range 500 {
		if err := g.AddString(strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	st := g.Stats()
	for i := range g.shards {
		want := reflect.ValueOf(g.shards[i].Stats())
		got := reflect.ValueOf(st.PerShard[i])
		for j := range want.NumField() {
			name := want.Type().Field(j).Name
			f := got.FieldByName(name)
			if !f.IsValid() {
				t.Errorf("ShardStats has no field %s", name)
				continue
			}
			if !reflect.DeepEqual(f.Interface(), want.Field(j).Interface()) {
				t.Errorf("shard %d: ShardStats.%s = %v, shard.Stats has %v", i, name, f.Interface(), want.Field(j).Interface())
			}
		}
	}
}

// TestStatsCountsAddsAndRemoves checks Adds and Removes, which the shards
// count: exact after concurrent adds and removes, and only what happened
// since a Restore, whose keys the shards count as inserts.
func TestStatsCountsAddsAndRemoves(t *testing.T) {
	const workers, perWorker = 4, 2000
	g := mustNew(t, WithCapacity(workers*perWorker))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				key := fmt.Sprintf("%d/%d", w, i)
				if err := g.AddString(key); err != nil {
					t.Error(err)
					return
				}
				if i%4 == 0 && !g.RemoveString(key) {
					t.Errorf("Remove(%q) = false after its Add", key)
					return
				}
			}
		})
	}
	wg.Wait()
	const adds, removes = workers * perWorker, workers * perWorker / 4
	st := g.Stats()
	if st.Adds != adds || st.Removes != removes || st.Items != adds-removes {
		t.Fatalf("Stats: %d adds, %d removes, %d items; want %d, %d, %d", st.Adds, st.Removes, st.Items, adds, removes, adds-removes)
	}

	var snap bytes.Buffer
	if _, err := g.WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	r, err := Restore(&snap)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if st := r.Stats(); st.Adds != 0 || st.Removes != 0 || st.Items != adds-removes {
		t.Fatalf("restored: %d adds, %d removes, %d items; want 0, 0, %d", st.Adds, st.Removes, st.Items, adds-removes)
	}
	if err := r.AddString("new"); err != nil {
		t.Fatal(err)
	}
	if !r.RemoveString("0/1") {
		t.Fatal(`Remove("0/1") = false in the restored guard`)
	}
	if st := r.Stats(); st.Adds != 1 || st.Removes != 1 || st.Items != adds-removes {
		t.Fatalf("restored, then one add and one remove: %d adds, %d removes, %d items; want 1, 1, %d", st.Adds, st.Removes, st.Items, adds-removes)
	}
}
