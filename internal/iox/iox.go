// Package iox holds the io helpers that the snapshot decoders of package
// shard and package guard share, and the atomic file writes of the
// followers' snapshot files (postgres and mysql).
package iox

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
)

// Unexpected turns a clean end of input, met in the middle of an encoding,
// into io.ErrUnexpectedEOF: the encoding is truncated, not empty.
func Unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// WriteFileAtomic writes a file at path through write, atomically: into a
// temporary file in the same directory, synced, renamed over path, and the
// directory synced (best effort: not every file system syncs one), so that
// a crash leaves the old file or the new one, never a torn one. It returns
// what write returned, and removes the temporary file on any error.
func WriteFileAtomic(path string, write func(w io.Writer) (int64, error)) (n int64, err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := bufio.NewWriterSize(tmp, 1<<16)
	if n, err = write(w); err != nil {
		return 0, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := w.Flush(); err != nil {
		return 0, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return 0, fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return 0, err
	}
	syncDir(dir)
	return n, nil
}

// RemoveFileDurably removes the file at path, if there is one, and syncs
// its directory (best effort), so that a crash does not bring it back.
func RemoveFileDurably(path string) error {
	if err := os.Remove(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	syncDir(filepath.Dir(path))
	return nil
}

// syncDir syncs directory dir, where the file system can.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// AppendField16 appends s to b as a snapshot file's header writes a
// string: its length as a little-endian uint16, then its bytes. s must
// be shorter than 64 KiB; callers bound or refuse longer ones first.
func AppendField16(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// CheckedReader reads a header that ends in a CRC-32 of its bytes (the
// followers' snapshot files): it keeps every byte it reads, so that
// Verify can check the sum over them.
type CheckedReader struct {
	r    io.Reader
	read []byte
}

// NewCheckedReader returns a CheckedReader of r.
func NewCheckedReader(r io.Reader) *CheckedReader {
	return &CheckedReader{r: r}
}

// Bytes reads the next n bytes.
func (c *CheckedReader) Bytes(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(c.r, b); err != nil {
		return nil, err
	}
	c.read = append(c.read, b...)
	return b, nil
}

// Field16 reads a string that AppendField16 wrote.
func (c *CheckedReader) Field16() (string, error) {
	lb, err := c.Bytes(2)
	if err != nil {
		return "", err
	}
	s, err := c.Bytes(int(binary.LittleEndian.Uint16(lb)))
	return string(s), err
}

// Verify reads the little-endian CRC-32 (of tab) that follows the header
// and checks it against every byte read so far. Its errors say "header:"
// and what went wrong, or "header checksum mismatch".
func (c *CheckedReader) Verify(tab *crc32.Table) error {
	var sum [4]byte
	if _, err := io.ReadFull(c.r, sum[:]); err != nil {
		return fmt.Errorf("header: %w", err)
	}
	if binary.LittleEndian.Uint32(sum[:]) != crc32.Checksum(c.read, tab) {
		return errors.New("header checksum mismatch")
	}
	return nil
}
