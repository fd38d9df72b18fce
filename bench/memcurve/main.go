// Command memcurve measures a guard's memory as the Go heap sees it and as
// Stats reports it, as a user would: runtime.GC, then runtime.MemStats'
// HeapAlloc minus the heap before the guard was made.
//
//	go -C bench run ./memcurve -mode growth     # WithCapacity(1000) to 2M keys, a sample every 40,000 adds
//	go -C bench run ./memcurve -mode capacity   # guards filled to their declared capacity
//	go -C bench run ./memcurve -mode cap        # WithMaxBytes against the heap
//	go -C bench run ./memcurve -mode chart -png growth.png main=old.csv new=new.csv
//
// The chart mode draws the CSV files of growth runs (each argument
// label=file) as one PNG: heap bits per key against keys, with the
// declared capacity (-from) and the aim of 27 bits per key marked.
//
// The growth mode prints one line per sample: keys, heap bits per key,
// Stats().Bytes in bits per key, their ratio, and the doublings in flight,
// marked "(moved)" where a background doubling changed Stats while the
// heap was read, which leaves that sample out of the worst ratio (-csv
// writes the samples as CSV, for -mode chart). Numbers are for the machine
// it runs on; the tables in the README name theirs.
package main

import (
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/memsize"
)

func main() {
	mode := flag.String("mode", "growth", "growth, capacity, cap or chart")
	from := flag.Int("from", 1000, "growth: the declared capacity")
	to := flag.Int("to", 2_000_000, "growth: keys added")
	every := flag.Int("every", 40_000, "growth: adds between samples")
	first := flag.Int("first", 100_000, "growth: the first sample that counts for the worst case")
	csvPath := flag.String("csv", "", "growth: also write the samples as CSV to this file")
	pngPath := flag.String("png", "growth.png", "chart: the PNG to write")
	flag.Parse()
	var err error
	switch *mode {
	case "growth":
		err = growth(os.Stdout, *from, *to, *every, *first, *csvPath)
	case "capacity":
		err = capacity(os.Stdout)
	case "cap":
		err = memCap(os.Stdout)
	case "chart":
		err = chart(*pngPath, flag.Args(), *from)
	default:
		err = fmt.Errorf("unknown mode %q", *mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "memcurve:", err)
		os.Exit(1)
	}
}

func key(i int) string { return "key-" + strconv.Itoa(i) }

// growth adds to keys to a guard declared for from and samples its memory
// every every adds.
func growth(w io.Writer, from, to, every, first int, csvPath string) error {
	var cw *csv.Writer
	if csvPath != "" {
		f, err := os.Create(csvPath)
		if err != nil {
			return err
		}
		defer f.Close()
		cw = csv.NewWriter(f)
		defer cw.Flush()
		cw.Write([]string{"keys", "heap_bits_per_key", "stats_bits_per_key"})
	}
	base := memsize.LiveHeap()
	g, err := guard.New(guard.WithCapacity(from), guard.WithSeed(1))
	if err != nil {
		return err
	}
	defer g.Close()
	fmt.Fprintf(w, "%10s %10s %10s %8s %9s\n", "keys", "heap b/k", "stats b/k", "stats/heap", "growing")
	worstHeap, worstStats, worstRatio := 0.0, 0.0, 1.0
	worstAt := 0
	for i := 0; i < to; i++ {
		if err := g.AddString(key(i)); err != nil {
			return fmt.Errorf("add %d: %w", i, err)
		}
		if n := i + 1; n%every == 0 {
			// A background doubling may allocate or drop a table while
			// the heap is read: Stats is read before and after, and a
			// sample where they differ says nothing of the ratio.
			s0 := g.Stats().Bytes
			h := memsize.LiveHeap() - base
			st := g.Stats()
			hb := 8 * float64(h) / float64(n)
			sb := 8 * float64(st.Bytes) / float64(n)
			r := float64(st.Bytes) / float64(h)
			moved := s0 != st.Bytes
			mark := ""
			if moved {
				mark = " (moved)"
			}
			fmt.Fprintf(w, "%10d %10.1f %10.1f %10.3f %9d%s\n", n, hb, sb, r, st.MigrationsInFlight, mark)
			if cw != nil {
				cw.Write([]string{strconv.Itoa(n), strconv.FormatFloat(hb, 'f', 2, 64), strconv.FormatFloat(sb, 'f', 2, 64)})
			}
			if n >= first {
				if hb > worstHeap {
					worstHeap, worstAt = hb, n
				}
				worstStats = max(worstStats, sb)
				if !moved && abs(r-1) > abs(worstRatio-1) {
					worstRatio = r
				}
			}
		}
	}
	fmt.Fprintf(w, "worst from %d keys: heap %.1f bits/key (at %d), stats %.1f bits/key, stats/heap %.3f\n",
		first, worstHeap, worstAt, worstStats, worstRatio)
	return nil
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// capacity fills guards to their declared capacity and compares the heap
// with Stats().Bytes.
func capacity(w io.Writer) error {
	fmt.Fprintf(w, "%10s %7s %10s %10s %10s\n", "capacity", "guards", "heap b/k", "stats b/k", "stats/heap")
	for _, c := range []struct{ capacity, guards int }{
		{1_000, 1000}, {10_000, 200}, {100_000, 20}, {1_000_000, 2}, {4_000_000, 1},
	} {
		base := memsize.LiveHeap()
		gs := make([]*guard.Guard, c.guards)
		for j := range gs {
			g, err := guard.New(guard.WithCapacity(c.capacity), guard.WithSeed(uint64(j)))
			if err != nil {
				return err
			}
			for i := range c.capacity {
				if err := g.AddString(key(j*c.capacity + i)); err != nil {
					return fmt.Errorf("capacity %d: add %d: %w", c.capacity, i, err)
				}
			}
			gs[j] = g
		}
		h := memsize.LiveHeap() - base
		stats := 0
		for _, g := range gs {
			stats += g.Stats().Bytes
		}
		n := float64(c.capacity * c.guards)
		fmt.Fprintf(w, "%10d %7d %10.1f %10.1f %10.3f\n", c.capacity, c.guards,
			8*float64(h)/n, 8*float64(stats)/n, float64(stats)/float64(h))
		for _, g := range gs {
			g.Close()
		}
		runtime.KeepAlive(gs)
	}
	return nil
}

// memCap grows guards capped by WithMaxBytes until they refuse keys and
// compares the heap with the cap.
func memCap(w io.Writer) error {
	fmt.Fprintf(w, "%10s %10s %10s %10s %10s\n", "cap", "keys", "heap", "stats", "heap/cap")
	for _, limit := range []int{256 << 10, 4 << 20, 64 << 20} {
		base := memsize.LiveHeap()
		g, err := guard.New(guard.WithCapacity(1000), guard.WithMaxBytes(limit), guard.WithSeed(1))
		if err != nil {
			return err
		}
		n := 0
		worst := int64(0)
		for ; ; n++ {
			err := g.AddString(key(n))
			if errors.Is(err, guard.ErrFull) {
				break
			}
			if err != nil {
				return err
			}
			if n%(limit/64) == 0 {
				worst = max(worst, memsize.LiveHeap()-base)
			}
		}
		h := memsize.LiveHeap() - base
		worst = max(worst, h)
		fmt.Fprintf(w, "%10d %10d %10d %10d %10.3f\n", limit, n, worst, g.Stats().Bytes, float64(worst)/float64(limit))
		g.Close()
	}
	return nil
}
