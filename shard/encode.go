package shard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Encoding of one shard (all integers little-endian):
//
//	k          uint8    log2 of the bucket count, in [1, VirtualBits-T]
//	T          uint8    tail bits, in [0, InitialTailBits]
//	stashLen   uint8    stash entries that follow, at most StashSize
//	reserved   uint8    0
//	items      uint64   items in buckets and stash
//	stash      stashLen × uint64, each bucket<<16 | slot
//	buckets    2^k × uint64
//
// The number of doublings is InitialTailBits - T. A shard that is doubling
// when it is encoded finishes the doubling first.

// ErrCorrupt is returned by [Shard.ReadFrom] for an encoding that is not a
// valid shard. The error wraps it with what was wrong.
var ErrCorrupt = errors.New("shard: corrupt encoding")

const encodedHeaderBytes = 12

// WriteTo writes the shard's encoding to w and returns the number of bytes
// written. It holds the shard's mutex while it runs, so writers of this
// shard wait and the encoding is a consistent snapshot of the shard;
// lookups do not wait. A doubling in progress is finished first.
func (s *Shard) WriteTo(w io.Writer) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finishGrowLocked()
	t := s.tab.Load()
	var stash []uint64
	for i := range t.stash {
		if e := t.stash[i].Load(); e != 0 {
			stash = append(stash, e)
		}
	}
	buf := make([]byte, 0, 64<<10)
	buf = append(buf, t.k, t.t, uint8(len(stash)), 0)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(s.items.Load()))
	for _, e := range stash {
		buf = binary.LittleEndian.AppendUint64(buf, e)
	}
	var n int64
	for _, b := range t.buckets {
		if len(buf)+8 > cap(buf) {
			m, err := w.Write(buf)
			n += int64(m)
			if err != nil {
				return n, err
			}
			buf = buf[:0]
		}
		buf = binary.LittleEndian.AppendUint64(buf, b)
	}
	m, err := w.Write(buf)
	return n + int64(m), err
}

// ReadFrom replaces the contents of s, which must be new (made by [New] or
// [Shard.Init] and not used since), with the encoding read from r, and
// returns the number of bytes read. Invalid input returns an error that
// wraps [ErrCorrupt] (or the reader's error, [io.ErrUnexpectedEOF] for a
// truncated encoding) and leaves s as it was. Memory is allocated as the
// input arrives, so a header that claims a huge table costs nothing until
// the bytes are there.
func (s *Shard) ReadFrom(r io.Reader) (int64, error) {
	var hdr [encodedHeaderBytes]byte
	n, err := io.ReadFull(r, hdr[:])
	read := int64(n)
	if err != nil {
		return read, fmt.Errorf("shard: read header: %w", eof(err))
	}
	k, tail, stashLen := hdr[0], hdr[1], int(hdr[2])
	items := binary.LittleEndian.Uint64(hdr[4:])
	switch {
	case hdr[3] != 0:
		return read, fmt.Errorf("%w: reserved byte %d", ErrCorrupt, hdr[3])
	case tail > InitialTailBits:
		return read, fmt.Errorf("%w: %d tail bits, at most %d", ErrCorrupt, tail, InitialTailBits)
	case k < 1 || int(k)+int(tail) > VirtualBits:
		return read, fmt.Errorf("%w: 2^%d buckets with %d tail bits", ErrCorrupt, k, tail)
	case stashLen > StashSize:
		return read, fmt.Errorf("%w: stash of %d entries, at most %d", ErrCorrupt, stashLen, StashSize)
	}
	t := &table{
		kmask: 1<<k - 1,
		vmask: 1<<(uint(k)+uint(tail)) - 1,
		tmask: 1<<tail - 1,
		k:     k,
		t:     tail,
	}
	maxSlot := uint64(1)<<(FingerprintBits+uint(tail)) - 1
	valid := func(s uint64) bool { return s>>tail != 0 && s <= maxSlot }
	count := uint64(0)
	for i := range stashLen {
		var b [8]byte
		n, err := io.ReadFull(r, b[:])
		read += int64(n)
		if err != nil {
			return read, fmt.Errorf("shard: read stash: %w", eof(err))
		}
		e := binary.LittleEndian.Uint64(b[:])
		if e>>laneBits > t.kmask || !valid(e&laneMask) {
			return read, fmt.Errorf("%w: stash entry %d is %#x", ErrCorrupt, i, e)
		}
		t.stash[i].Store(e)
		count++
	}
	t.stashN.Store(int32(stashLen))

	nb := uint64(1) << k
	const chunk = 8 << 10 // buckets per read
	buf := make([]byte, 8*min(nb, chunk))
	for len(t.buckets) < int(nb) {
		want := min(nb-uint64(len(t.buckets)), chunk)
		n, err := io.ReadFull(r, buf[:8*want])
		read += int64(n)
		if err != nil {
			return read, fmt.Errorf("shard: read buckets: %w", eof(err))
		}
		for i := range want {
			b := binary.LittleEndian.Uint64(buf[8*i:])
			for l := range slotsPerBucket {
				if sl := laneOf(b, l); sl != 0 {
					if !valid(sl) {
						return read, fmt.Errorf("%w: bucket %d holds slot %#x", ErrCorrupt, len(t.buckets), sl)
					}
					count++
				}
			}
			t.buckets = append(t.buckets, b)
		}
	}
	if count != items {
		return read, fmt.Errorf("%w: %d items recorded, %d stored", ErrCorrupt, items, count)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tab.Store(t)
	s.items.Store(int64(items))
	s.doublings.Store(int32(InitialTailBits - tail))
	return read, nil
}

// eof turns a clean end of input in the middle of an encoding into
// io.ErrUnexpectedEOF.
func eof(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
