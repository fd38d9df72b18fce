package shard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cuckooguard/cuckooguard/internal/iox"
)

// Encoding of one shard (all integers little-endian):
//
//	k          uint8    log2 of the bucket count, in [1, VirtualBits]
//	reserved   uint8    0
//	stashLen   uint16   stash entries that follow, at most maxStash
//	doublings  uint32   times the shard has doubled
//	items      uint64   items inserted and not deleted
//	copies     uint64   occupied slots, in buckets and stash
//	stash      stashLen × uint64, each bucket<<16 | slot
//	buckets    2^k × uint64
//
// A shard that is doubling when it is encoded finishes the doubling first.

const encodedHeaderBytes = 24

// maxStash bounds the stash length an encoding may claim. Eviction paths
// stash at most StashSize entries; only entries that no doubling can tell
// apart from their neighbours add more.
const maxStash = 1 << 12

// WriteTo writes the shard's encoding to w and returns the number of bytes
// written. It holds the shard's mutex while it runs, so writers of this
// shard wait and the encoding is a consistent snapshot of the shard;
// lookups do not wait. A doubling in progress is finished first.
func (s *Shard) WriteTo(w io.Writer) (int64, error) {
	if w == nil {
		return 0, errors.New("shard: WriteTo needs a writer")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finishGrowLocked()
	// Lock-free writers wait too: the counts written first must be those
	// of the buckets written after them.
	s.closeGateLocked()
	defer s.openGateLocked()
	t := s.tab.Load()
	stash := t.stashEntries()
	buf := make([]byte, 0, 64<<10)
	buf = append(buf, t.k, 0)
	buf = binary.LittleEndian.AppendUint16(buf, uint16(len(stash)))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(s.doublings.Load()))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(s.Len()))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(s.copiesNow()))
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
	if r == nil {
		return 0, errors.New("shard: ReadFrom needs a reader")
	}
	var hdr [encodedHeaderBytes]byte
	n, err := io.ReadFull(r, hdr[:])
	read := int64(n)
	if err != nil {
		return read, fmt.Errorf("shard: read header: %w", iox.Unexpected(err))
	}
	k, stashLen := hdr[0], int(binary.LittleEndian.Uint16(hdr[2:]))
	doublings := binary.LittleEndian.Uint32(hdr[4:])
	items := binary.LittleEndian.Uint64(hdr[8:])
	copies := binary.LittleEndian.Uint64(hdr[16:])
	switch {
	case hdr[1] != 0:
		return read, fmt.Errorf("%w: reserved byte %#x", ErrCorrupt, hdr[1])
	case k < 1 || k > maxTableLog2:
		return read, fmt.Errorf("%w: 2^%d buckets", ErrCorrupt, k)
	case doublings >= uint32(k):
		return read, fmt.Errorf("%w: %d doublings of a table of 2^%d buckets", ErrCorrupt, doublings, k)
	case stashLen > maxStash:
		return read, fmt.Errorf("%w: stash of %d entries, at most %d", ErrCorrupt, stashLen, maxStash)
	case items > copies:
		return read, fmt.Errorf("%w: %d items in %d slots", ErrCorrupt, items, copies)
	}
	t := newTableHeader(k)
	t.stashRoom = int32(max(StashSize, stashLen))
	maxTail := t.tnew()
	valid := func(sl uint64) bool { return sl>>8 != 0 && sl&0xff != 0 && tailLen(sl) <= maxTail }
	count := uint64(0)
	for i := range stashLen {
		var b [8]byte
		n, err := io.ReadFull(r, b[:])
		read += int64(n)
		if err != nil {
			return read, fmt.Errorf("shard: read stash: %w", iox.Unexpected(err))
		}
		e := binary.LittleEndian.Uint64(b[:])
		if e>>laneBits >= uint64(1)<<k || !valid(e&laneMask) {
			return read, fmt.Errorf("%w: stash entry %d is %#x", ErrCorrupt, i, e)
		}
		t.stashAdd(e>>laneBits, e&laneMask)
		t.count(e&laneMask, 1)
		count++
	}

	nb := uint64(1) << k
	const chunk = 8 << 10 // buckets per read
	buf := make([]byte, 8*min(nb, chunk))
	for uint64(len(t.buckets)) < nb {
		want := min(nb-uint64(len(t.buckets)), chunk)
		n, err := io.ReadFull(r, buf[:8*want])
		read += int64(n)
		if err != nil {
			return read, fmt.Errorf("shard: read buckets: %w", iox.Unexpected(err))
		}
		for i := range want {
			b := binary.LittleEndian.Uint64(buf[8*i:])
			for l := range slotsPerBucket {
				if sl := laneOf(b, l); sl != 0 {
					if !valid(sl) {
						return read, fmt.Errorf("%w: bucket %d holds slot %#x", ErrCorrupt, len(t.buckets), sl)
					}
					t.count(sl, 1)
					count++
				}
			}
			t.buckets = append(t.buckets, b)
		}
	}
	if count != copies {
		return read, fmt.Errorf("%w: %d slots recorded, %d stored", ErrCorrupt, copies, count)
	}
	t.exact = t.tnew() == MaxTailBits && t.histogram(int(copies))[MaxTailBits] == int(copies)
	s.mu.Lock()
	defer s.mu.Unlock()
	t.refused.Store(s.tab.Load().refused.Load())
	s.tab.Store(t)
	s.fullDeletes = 0 // a search in the table replaced says nothing about t
	// s is new: its stripes, made for the table Init made, are made again
	// for the one read.
	s.initCounters(int(t.k))
	s.stripe(0).inserts.Store(items)
	s.copies.Store(int64(copies - items)) // the stripe holds back the items
	s.doublings.Store(int32(doublings))
	return read, nil
}
