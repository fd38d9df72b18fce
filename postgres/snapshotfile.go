package postgres

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/jackc/pglogrepl"

	"github.com/cuckooguard/cuckooguard/guard"
)

// A snapshot file is a header and a guard snapshot (guard.Guard.WriteTo,
// which checksums itself):
//
//	magic "CGFS", version uint16, reserved uint16, LSN uint64,
//	slot, table and key column, each a uint16 length and its bytes,
//	CRC-32C of everything before it, uint32
//
// all little-endian. The LSN is the end of the last transaction the guard
// reflects: the Follower streams from it.
const (
	snapFileMagic   = "CGFS"
	snapFileVersion = 1
)

// errSnapshotFile wraps every reason a snapshot file cannot be used.
var errSnapshotFile = errors.New("postgres: snapshot file")

// snapFile is what a snapshot file says of itself.
type snapFile struct {
	lsn              pglogrepl.LSN
	slot, table, key string
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// writeSnapshotFile writes g with what it reflects to path, atomically: a
// temporary file in the same directory, synced, renamed over path, and the
// directory synced, so that a crash leaves the old file or the new one.
// It returns the bytes written.
func writeSnapshotFile(path string, h snapFile, g *guard.Guard) (n int64, err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errSnapshotFile, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := bufio.NewWriterSize(tmp, 1<<16)
	hdr := h.marshal()
	if _, err := w.Write(hdr); err != nil {
		return 0, fmt.Errorf("%w: write %s: %w", errSnapshotFile, tmp.Name(), err)
	}
	gn, err := g.WriteTo(w)
	if err != nil {
		return 0, fmt.Errorf("%w: write %s: %w", errSnapshotFile, tmp.Name(), err)
	}
	if err := w.Flush(); err != nil {
		return 0, fmt.Errorf("%w: write %s: %w", errSnapshotFile, tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return 0, fmt.Errorf("%w: sync %s: %w", errSnapshotFile, tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("%w: close %s: %w", errSnapshotFile, tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return 0, fmt.Errorf("%w: %w", errSnapshotFile, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // the rename: best effort, not every file system syncs a directory
		d.Close()
	}
	return int64(len(hdr)) + gn, nil
}

// marshal returns h's header bytes, checksum included.
func (h snapFile) marshal() []byte {
	b := make([]byte, 0, 64)
	b = append(b, snapFileMagic...)
	b = binary.LittleEndian.AppendUint16(b, snapFileVersion)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.lsn))
	for _, s := range []string{h.slot, h.table, h.key} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// readSnapshotFile reads the snapshot file at path: its header, and the
// guard it holds, restored with opts. It returns an error wrapping
// os.ErrNotExist for a missing file, and errSnapshotFile for one it cannot
// use; never a guard from a file it could not read whole.
func readSnapshotFile(path string, opts ...guard.Option) (snapFile, *guard.Guard, error) {
	f, err := os.Open(path)
	if err != nil {
		return snapFile{}, nil, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	bad := func(why string, args ...any) (snapFile, *guard.Guard, error) {
		return snapFile{}, nil, fmt.Errorf("%w %s: %s", errSnapshotFile, path, fmt.Sprintf(why, args...))
	}
	fixed := make([]byte, 16)
	if _, err := io.ReadFull(r, fixed); err != nil {
		return bad("header: %v", err)
	}
	if string(fixed[:4]) != snapFileMagic {
		return bad("not a follower's snapshot (magic %q)", fixed[:4])
	}
	if v := binary.LittleEndian.Uint16(fixed[4:]); v != snapFileVersion {
		return bad("version %d, want %d", v, snapFileVersion)
	}
	h := snapFile{lsn: pglogrepl.LSN(binary.LittleEndian.Uint64(fixed[8:]))}
	hdr := fixed
	var fields [3]string
	for i := range fields {
		var lb [2]byte
		if _, err := io.ReadFull(r, lb[:]); err != nil {
			return bad("header: %v", err)
		}
		s := make([]byte, binary.LittleEndian.Uint16(lb[:]))
		if _, err := io.ReadFull(r, s); err != nil {
			return bad("header: %v", err)
		}
		hdr = append(append(hdr, lb[:]...), s...)
		fields[i] = string(s)
	}
	var sum [4]byte
	if _, err := io.ReadFull(r, sum[:]); err != nil {
		return bad("header: %v", err)
	}
	if binary.LittleEndian.Uint32(sum[:]) != crc32.Checksum(hdr, castagnoli) {
		return bad("header checksum mismatch")
	}
	h.slot, h.table, h.key = fields[0], fields[1], fields[2]
	g, err := guard.Restore(r, opts...)
	if err != nil {
		return bad("guard: %v", err)
	}
	return h, g, nil
}
