package guard

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"

	"github.com/zeebo/xxh3"

	"github.com/cuckooguard/cuckooguard/internal/iox"
	"github.com/cuckooguard/cuckooguard/internal/options"
	"github.com/cuckooguard/cuckooguard/shard"
)

// Snapshot format, version 2 (all integers little-endian):
//
//	magic     [4]byte  "CKGD"
//	version   uint16   2
//	flags     uint16   flagDegraded, or 0
//	seed      uint64   the hash seed
//	shards    uint32   number of shards, in [1, MaxShards]
//	bounds    uint32   0 for equal shards, else = shards (mixed layout)
//	bound     bounds × uint32, strictly increasing, the last = 2^16
//	degraded  ⌈shards/64⌉ × uint64, with flagDegraded only: bit i%64 of
//	          word i/64 is set for a degraded shard i (Guard.Degraded),
//	          no bit at or above shards, at least one bit
//	shard     shards × the encoding of package shard (see shard.Shard.WriteTo)
//	checksum  uint64   xxh3 of every byte before it
//
// Each shard is encoded under its own lock, so a snapshot taken while
// writers run is consistent per shard but not across shards. The degraded
// marks are read before the first shard. A restored guard is older than
// the store it guards; see guarded.Loader.CatchUp.
//
// A snapshot of a guard with no degraded shard is byte for byte what
// releases before the degraded marks wrote, and they read it; one with
// degraded shards they refuse ("unknown flags 0x1"), rather than restore
// a guard that would answer absent for the keys its shards refused.
//
// The checksum catches accidents (a truncated, torn or bit-rotted file)
// with probability 1 - 2^-64; it is not a signature: whoever can write
// the file can recompute it. Restore also refuses what no guard can hold
// (counts that disagree with the slots, tails shorter than the shard's
// doublings allow), but an edited fingerprint it cannot tell from a real
// one: keep snapshots where only the process that wrote them can write.
//
// Version 1 snapshots hold the fixed-tail slots of earlier releases, whose
// keys sit at other positions; [Restore] refuses them (rebuild the guard
// from the store instead).

const (
	snapshotMagic   = "CKGD"
	snapshotVersion = 2
	// flagDegraded says that the degraded bitmap follows the routing
	// bounds.
	flagDegraded = 1
)

var _ io.WriterTo = (*Guard)(nil)

// WriteTo writes a snapshot of the guard to w in the format described
// above and returns the number of bytes written. Lookups do not wait for
// it; writers of each shard wait while that shard is written. Restore it
// with [Restore].
func (g *Guard) WriteTo(w io.Writer) (int64, error) {
	if w == nil {
		return 0, errors.New("guard: WriteTo needs a writer")
	}
	cw := &countingWriter{w: bufio.NewWriterSize(w, 64<<10), h: xxh3.New()}
	marks := make([]uint64, len(g.degraded))
	flags := uint16(0)
	for i := range marks {
		if marks[i] = g.degraded[i].Load(); marks[i] != 0 {
			flags = flagDegraded
		}
	}
	hdr := make([]byte, 0, 24+4*len(g.lay.bounds)+8*len(marks))
	hdr = append(hdr, snapshotMagic...)
	hdr = binary.LittleEndian.AppendUint16(hdr, snapshotVersion)
	hdr = binary.LittleEndian.AppendUint16(hdr, flags)
	hdr = binary.LittleEndian.AppendUint64(hdr, g.seed)
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(g.shards)))
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(g.lay.bounds)))
	for _, b := range g.lay.bounds {
		hdr = binary.LittleEndian.AppendUint32(hdr, b)
	}
	if flags&flagDegraded != 0 {
		for _, m := range marks {
			hdr = binary.LittleEndian.AppendUint64(hdr, m)
		}
	}
	if _, err := cw.Write(hdr); err != nil {
		return cw.n, fmt.Errorf("guard: write snapshot header: %w", err)
	}
	for i := range g.shards {
		if _, err := g.shards[i].WriteTo(cw); err != nil {
			return cw.n, fmt.Errorf("guard: write snapshot of shard %d: %w", i, err)
		}
	}
	sum := binary.LittleEndian.AppendUint64(nil, cw.h.Sum64())
	if _, err := cw.w.Write(sum); err != nil {
		return cw.n, fmt.Errorf("guard: write snapshot checksum: %w", err)
	}
	cw.n += int64(len(sum))
	if err := cw.w.Flush(); err != nil {
		return cw.n, fmt.Errorf("guard: write snapshot: %w", err)
	}
	return cw.n, nil
}

// countingWriter counts and hashes what it writes.
type countingWriter struct {
	w *bufio.Writer
	h *xxh3.Hasher
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// hashingReader hashes what it reads.
type hashingReader struct {
	r io.Reader
	h *xxh3.Hasher
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	return n, err
}

// Restore reads a snapshot written by [Guard.WriteTo] and returns the guard
// it holds. The snapshot fixes the seed and the layout: [WithSeed] and
// [WithShards], if given, must match it, and [WithCapacity] is ignored;
// [WithGrowThreshold], [WithMaxBytes] and [WithGrowWorkers] apply.
//
// Truncated, corrupted or mismatched input returns an error (wrapping
// [ErrSnapshot] or [io.ErrUnexpectedEOF]) and no guard. Restore reads r to
// the end of the snapshot and no further than its checksum.
func Restore(r io.Reader, opts ...Option) (*Guard, error) {
	if r == nil {
		return nil, errors.New("guard: Restore needs a reader")
	}
	c := defaultConfig()
	if err := options.Apply("guard: Restore", &c, opts); err != nil {
		return nil, err
	}
	growth, err := c.validate()
	if err != nil {
		return nil, err
	}
	hr := &hashingReader{r: r, h: xxh3.New()}
	var hdr [24]byte
	if _, err := io.ReadFull(hr, hdr[:]); err != nil {
		return nil, fmt.Errorf("guard: read snapshot header: %w", iox.Unexpected(err))
	}
	if string(hdr[:4]) != snapshotMagic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrSnapshot, hdr[:4])
	}
	switch v := binary.LittleEndian.Uint16(hdr[4:]); v {
	case snapshotVersion:
	case 1:
		return nil, fmt.Errorf("%w: version 1 is the fixed-tail layout of earlier releases, which this release cannot read; build the guard from the store again", ErrSnapshot)
	default:
		return nil, fmt.Errorf("%w: version %d, want %d", ErrSnapshot, v, snapshotVersion)
	}
	flags := binary.LittleEndian.Uint16(hdr[6:])
	if f := flags &^ flagDegraded; f != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrSnapshot, f)
	}
	seed := binary.LittleEndian.Uint64(hdr[8:])
	n := binary.LittleEndian.Uint32(hdr[16:])
	nb := binary.LittleEndian.Uint32(hdr[20:])
	if n < 1 || n > MaxShards {
		return nil, fmt.Errorf("%w: %d shards", ErrSnapshot, n)
	}
	if nb != 0 && (nb != n || n > maxMixedShards) {
		return nil, fmt.Errorf("%w: %d routing bounds for %d shards", ErrSnapshot, nb, n)
	}
	if c.seedSet && c.seed != seed {
		return nil, fmt.Errorf("%w: seed %d does not match WithSeed(%d)", ErrSnapshot, seed, c.seed)
	}
	if c.shardsSet && c.shards != int(n) {
		return nil, fmt.Errorf("%w: %d shards do not match WithShards(%d)", ErrSnapshot, n, c.shards)
	}
	lay := layout{logs: make([]int, n)}
	if nb != 0 {
		buf := make([]byte, 4*nb)
		if _, err := io.ReadFull(hr, buf); err != nil {
			return nil, fmt.Errorf("guard: read snapshot routing bounds: %w", iox.Unexpected(err))
		}
		lay.bounds = make([]uint32, nb)
		prev := uint32(0)
		for i := range lay.bounds {
			b := binary.LittleEndian.Uint32(buf[4*i:])
			if b <= prev || b > 1<<routeBits || i == len(lay.bounds)-1 && b != 1<<routeBits {
				return nil, fmt.Errorf("%w: routing bound %d is %d", ErrSnapshot, i, b)
			}
			lay.bounds[i], prev = b, b
		}
	}
	g := newGuardValue(lay, seed)
	if flags&flagDegraded != 0 {
		buf := make([]byte, 8*len(g.degraded))
		if _, err := io.ReadFull(hr, buf); err != nil {
			return nil, fmt.Errorf("guard: read snapshot degraded shards: %w", iox.Unexpected(err))
		}
		any := false
		for i := range g.degraded {
			m := binary.LittleEndian.Uint64(buf[8*i:])
			if i == len(g.degraded)-1 && n%64 != 0 && m>>(n%64) != 0 {
				return nil, fmt.Errorf("%w: degraded marks of shards past the %d there are", ErrSnapshot, n)
			}
			g.degraded[i].Store(m)
			any = any || m != 0
		}
		if !any {
			return nil, fmt.Errorf("%w: the degraded flag without a degraded shard", ErrSnapshot)
		}
	}
	for i := range g.shards {
		// Init makes the shard usable; ReadFrom then replaces its table.
		if err := g.shards[i].Init(1); err != nil {
			return nil, err
		}
		if _, err := g.shards[i].ReadFrom(hr); err != nil {
			if errors.Is(err, shard.ErrCorrupt) {
				return nil, fmt.Errorf("%w: shard %d: %w", ErrSnapshot, i, err)
			}
			return nil, fmt.Errorf("guard: read snapshot shard %d: %w", i, err)
		}
		st := g.shards[i].Stats()
		if err := plausible(st); err != nil {
			return nil, fmt.Errorf("%w: shard %d: %w", ErrSnapshot, i, err)
		}
		g.lay.logs[i] = bits.Len(uint(st.Buckets)) - 1
	}
	want := hr.h.Sum64()
	var sum [8]byte
	if _, err := io.ReadFull(r, sum[:]); err != nil {
		return nil, fmt.Errorf("guard: read snapshot checksum: %w", iox.Unexpected(err))
	}
	if got := binary.LittleEndian.Uint64(sum[:]); got != want {
		return nil, fmt.Errorf("%w: checksum %#x, computed %#x", ErrSnapshot, got, want)
	}
	// The snapshot does not record the capacity the guard was made with:
	// a rebuild sizes its replacement from the keys it holds.
	g.restored = uint64(g.Len())
	c.capacity = max(g.Len(), 1)
	if err := g.start(c, growth); err != nil {
		return nil, err
	}
	return g, nil
}

// plausible checks what a shard's encoding says against what any shard
// can hold, beyond what shard.Shard.ReadFrom checks: a slot's tail is
// shortened only by the doublings since its insert, so none is shorter
// than the doublings allow; and the slots beyond the items are the
// copies of void entries (see shard.Stats), of which there are as many
// void slots at least. An edit that passes the checksum (recomputed) and
// these is one Restore cannot tell (see the format above).
func plausible(st shard.Stats) error {
	k := bits.Len(uint(st.Buckets)) - 1
	minTail := shard.MaxTailBits
	for k0 := k - st.Doublings; k0 <= k; k0++ {
		// An entry inserted into the table of 2^k0 buckets, then doubled
		// k-k0 times.
		minTail = min(minTail, max(min(shard.MaxTailBits, shard.VirtualBits-k0)-(k-k0), 0))
	}
	for tl := 0; tl < minTail; tl++ {
		if st.Tails[tl] != 0 {
			return fmt.Errorf("%d entries with a tail of %d bits after %d doublings", st.Tails[tl], tl, st.Doublings)
		}
	}
	if extra := st.Copies - st.Items; extra > st.Tails[0] {
		return fmt.Errorf("%d slots beyond its %d items, and %d void ones", extra, st.Items, st.Tails[0])
	}
	return nil
}
