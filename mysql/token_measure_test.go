package mysql

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cuckooguard/cuckooguard/guarded"
)

// TestMeasureTokenWait measures, with CUCKOOGUARD_MEASURE=1, how long a
// lookup under a write's token waits on a follower's Loader (the default
// token wait, 50 ms) while writers commit 500 transactions a second:
// each commit is an insert (or, in the second case, one in four a delete
// of the writer's key of a second before, which holds the positions behind it until the
// delete is visible), followed by WriteToken and the lookup of its key.
func TestMeasureTokenWait(t *testing.T) {
	if os.Getenv("CUCKOOGUARD_MEASURE") != "1" {
		t.Skip("set CUCKOOGUARD_MEASURE=1 to measure")
	}
	srv := testDSN(t)
	strictGTID(t, srv)
	for _, tc := range []struct {
		name    string
		deletes int // one commit in deletes is a delete; 0 for none
	}{
		{"inserts", 0},
		{"one in four a delete", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, _ := newTable(t, srv, "id BIGINT NOT NULL PRIMARY KEY", "")
			db := openDB(t, srv)
			n := startTokenNode(t, srv, table, nil)
			n.waitCurrent(t)
			const writers, rate, run = 8, 500, 5 * time.Second
			var mu sync.Mutex
			var all, waited []time.Duration
			var passed, wrong, commits int
			ctx, stop := context.WithTimeout(context.Background(), run)
			defer stop()
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					tick := time.NewTicker(time.Second * writers / rate)
					defer tick.Stop()
					for i := int64(0); ; i++ {
						select {
						case <-ctx.Done():
							return
						case <-tick.C:
						}
						id := i*writers + int64(w)
						q := fmt.Sprintf("INSERT INTO `%s` (id) VALUES (%d)", table, id)
						del := tc.deletes > 0 && i%int64(tc.deletes) == int64(tc.deletes-1)
						if del {
							// A key of a second ago: no lookup of it is
							// still waiting.
							q = fmt.Sprintf("DELETE FROM `%s` WHERE id = %d", table, id-rate/writers*writers)
						}
						if _, err := db.ExecContext(context.Background(), q); err != nil {
							t.Error(err)
							return
						}
						tok, err := WriteToken(context.Background(), db)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						commits++
						mu.Unlock()
						if del {
							continue
						}
						// Looked up at once, on a goroutine of its own: a
						// lookup that waits does not slow the writer.
						wg.Go(func() {
							before := n.loader.Stats()
							start := time.Now()
							present := n.loader.MayContainContext(guarded.WithToken(context.Background(), tok), id)
							took := time.Since(start)
							after := n.loader.Stats()
							mu.Lock()
							defer mu.Unlock()
							all = append(all, took)
							if after.TokenWaits > before.TokenWaits {
								waited = append(waited, took)
							}
							if after.TokenPassed > before.TokenPassed {
								passed++
							}
							if !present {
								wrong++
							}
						})
					}
				})
			}
			wg.Wait()
			q := func(d []time.Duration, p float64) time.Duration {
				if len(d) == 0 {
					return 0
				}
				slices.Sort(d)
				return d[int(float64(len(d)-1)*p)].Round(time.Microsecond)
			}
			t.Logf("%d commits in %v (%.0f/s); %d lookups under their token: %d absent (wrong 404s), %d waited (%.1f%%), %d passed through after 50 ms; lookup time p50 %v p99 %v max %v; of those that waited p50 %v p99 %v",
				commits, run, float64(commits)/run.Seconds(), len(all), wrong, len(waited), 100*float64(len(waited))/float64(len(all)), passed,
				q(all, 0.5), q(all, 0.99), q(all, 1), q(waited, 0.5), q(waited, 0.99))
			if wrong != 0 {
				t.Fatalf("%d wrong 404s", wrong)
			}
		})
	}
}
