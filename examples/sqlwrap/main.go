// Command sqlwrap guards a SQL lookup with a cuckooguard Loader and shows
// how many queries the guard saves.
//
// It opens (or creates) a users table, seeds ids 1..N, fills a guard from
// `SELECT id FROM users`, wraps `SELECT name FROM users WHERE id = $1` with
// a Loader, runs a mix of lookups for present and absent ids, and prints
// how many queries reached the database and how many the guard answered.
//
//	go run ./sqlwrap                      # embedded SQLite in the temp dir
//	go run ./sqlwrap -rows 1000000 -lookups 2000000 -absent 0.9
//	go run ./sqlwrap -dsn postgres://user:pass@127.0.0.1:5432/db
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"time"

	"github.com/cuckooguard/cuckooguard/examples/userdb"
	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/guarded"
)

func main() {
	dsn := flag.String("dsn", "", "postgres:// URL, or a SQLite file path (default: a file in the temp dir)")
	rows := flag.Int64("rows", 100_000, "users to seed, ids 1..rows")
	lookups := flag.Int("lookups", 200_000, "lookups to run")
	absent := flag.Float64("absent", 0.5, "fraction of lookups for ids that do not exist")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *dsn, *rows, *lookups, *absent); err != nil {
		fmt.Fprintln(os.Stderr, "sqlwrap:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn string, rows int64, lookups int, absent float64) error {
	if rows < 1 || lookups < 0 || absent < 0 || absent > 1 {
		return errors.New("need -rows >= 1, -lookups >= 0 and -absent in [0, 1]")
	}
	if dsn == "" {
		dsn = userdb.DefaultSQLitePath("sqlwrap")
	}
	db, err := userdb.Open(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.Migrate(ctx); err != nil {
		return err
	}
	start := time.Now()
	reused, err := db.SeedExactly(ctx, rows, nil)
	if err != nil {
		return err
	}
	if reused {
		fmt.Printf("database: %s %s: reused the %d users an earlier run seeded\n", db.Driver, dsn, rows)
	} else {
		fmt.Printf("database: %s %s: %d users seeded in %v\n", db.Driver, dsn, rows, time.Since(start).Round(time.Millisecond))
	}

	g, err := guard.New(guard.WithCapacity(int(rows)))
	if err != nil {
		return err
	}
	loader, err := guarded.New(g, guarded.Funcs[int64, userdb.User]{Lookup: db.Lookup, ListKeys: db.IDs},
		guarded.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	if err != nil {
		g.Close()
		return err
	}
	defer loader.Close()
	if err := loader.Fill(ctx, db.IDs(ctx)); err != nil {
		return err
	}

	db.Lookups.Store(0)
	r := rand.New(rand.NewPCG(1, 2))
	found, missing := 0, 0
	start = time.Now()
	for range lookups {
		id := 1 + r.Int64N(rows) // present
		if r.Float64() < absent {
			id = rows + 1 + r.Int64N(1<<40) // absent
		}
		_, err := loader.Get(ctx, id)
		switch {
		case err == nil:
			found++
		case errors.Is(err, guarded.ErrNotFound):
			missing++
		default:
			return err
		}
	}
	took := time.Since(start)
	st := loader.Stats()
	fmt.Printf("%d lookups in %v: %d found, %d not found\n", lookups, took.Round(time.Millisecond), found, missing)
	fmt.Printf("queries sent to the database: %d; answered by the guard: %d (%.1f%% of all lookups)\n",
		db.Lookups.Load(), st.Avoided, 100*float64(st.Avoided)/float64(max(lookups, 1)))
	fmt.Printf("false positives: %d (observed FPR %.2g); guard: %d keys, %.1f bits/key, estimated FPR %.2g\n",
		st.FalsePositives, st.ObservedFPR, st.Guard.Items, st.Guard.BitsPerItem, st.Guard.EstimatedFPR)
	return nil
}
