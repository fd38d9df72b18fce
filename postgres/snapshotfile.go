package postgres

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/jackc/pglogrepl"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/iox"
)

// A snapshot file is a header and a guard snapshot (guard.Guard.WriteTo,
// which checksums itself):
//
//	magic "CGFS", version uint16, reserved uint16, LSN uint64,
//	the slot's creation LSN uint64,
//	system identifier, database, slot, table, key column and publication
//	version, each a uint16 length and its bytes,
//	CRC-32C of everything before it, uint32
//
// all little-endian. The LSN is the end of the last transaction the guard
// reflects: the Follower streams from it. The system identifier,
// database, slot name and creation LSN name the slot instance whose
// stream the LSN is a position in (slotID): a file of another cluster, or
// of a slot since made again, is not used. The publication version says
// under which publication the guard's changes were decoded
// (publicationVersion). Version 1 files (without them) are refused: the
// follower reads the table instead.
const (
	snapFileMagic   = "CGFS"
	snapFileVersion = 2
)

// errSnapshotFile wraps every reason a snapshot file cannot be used.
var errSnapshotFile = errors.New("postgres: snapshot file")

// snapFile is what a snapshot file says of itself.
type snapFile struct {
	lsn        pglogrepl.LSN
	slot       slotID
	table, key string
	pubVersion string
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// writeSnapshotFile writes g with what it reflects to path, atomically: a
// temporary file in the same directory, synced, renamed over path, and the
// directory synced, so that a crash leaves the old file or the new one.
// It returns the bytes written.
func writeSnapshotFile(path string, h snapFile, g *guard.Guard) (int64, error) {
	hdr := h.marshal()
	n, err := iox.WriteFileAtomic(path, func(w io.Writer) (int64, error) {
		if _, err := w.Write(hdr); err != nil {
			return 0, err
		}
		gn, err := g.WriteTo(w)
		return int64(len(hdr)) + gn, err
	})
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errSnapshotFile, err)
	}
	return n, nil
}

// marshal returns h's header bytes, checksum included.
func (h snapFile) marshal() []byte {
	b := make([]byte, 0, 128)
	b = append(b, snapFileMagic...)
	b = binary.LittleEndian.AppendUint16(b, snapFileVersion)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.lsn))
	b = binary.LittleEndian.AppendUint64(b, uint64(h.slot.created))
	for _, s := range h.fields() {
		b = iox.AppendField16(b, (*s)[:min(len(*s), 1<<16-1)])
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// fields returns the header's strings, in their order in the file.
func (h *snapFile) fields() []*string {
	return []*string{&h.slot.system, &h.slot.database, &h.slot.name, &h.table, &h.key, &h.pubVersion}
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
	c := iox.NewCheckedReader(r)
	fixed, err := c.Bytes(24)
	if err != nil {
		return bad("header: %v", err)
	}
	if string(fixed[:4]) != snapFileMagic {
		return bad("not a follower's snapshot (magic %q)", fixed[:4])
	}
	if v := binary.LittleEndian.Uint16(fixed[4:]); v != snapFileVersion {
		return bad("version %d, want %d", v, snapFileVersion)
	}
	h := snapFile{lsn: pglogrepl.LSN(binary.LittleEndian.Uint64(fixed[8:]))}
	h.slot.created = pglogrepl.LSN(binary.LittleEndian.Uint64(fixed[16:]))
	for _, f := range h.fields() {
		if *f, err = c.Field16(); err != nil {
			return bad("header: %v", err)
		}
	}
	if err := c.Verify(castagnoli); err != nil {
		return bad("%v", err)
	}
	g, err := guard.Restore(r, opts...)
	if err != nil {
		return bad("guard: %v", err)
	}
	return h, g, nil
}

// removeSnapshotFile removes the snapshot file at path, if there is one,
// durably: the directory is synced, so that a crash does not bring it
// back (best effort where the file system cannot sync a directory).
func removeSnapshotFile(path string) error {
	if err := iox.RemoveFileDurably(path); err != nil {
		return fmt.Errorf("%w: %w", errSnapshotFile, err)
	}
	return nil
}
