package mysql

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strconv"

	"github.com/cuckooguard/cuckooguard/guard"
	"github.com/cuckooguard/cuckooguard/internal/iox"
)

// A snapshot file is a header and a guard snapshot (guard.Guard.WriteTo,
// which checksums itself):
//
//	magic "CGMB", version uint16, reserved uint16,
//	server id uint32, start uint32, end uint32,
//	GTID domain uint32, server uint32, seq uint64, hash uint64,
//	binlog file, GTID position, table, key column, then the key column's
//	layout (12 fields), each a uint16 length and its bytes,
//	held deletions: a uint32 count, each a uint16 length and the key's text,
//	CRC-32C of everything before it, uint32
//
// all little-endian. The position (resume.go) is the last transaction the
// guard reflects: a new process proves it as a session proves its own
// (resumePoint.refuse, then the stream's first transaction), and streams
// on from it. The held deletions are those the guard still holds the keys
// of, waiting to be visible (visible.go): the new process releases them
// once its first marker is back.
const (
	snapFileMagic   = "CGMB"
	snapFileVersion = 1
)

// errSnapshotFile wraps every reason a snapshot file cannot be used.
var errSnapshotFile = errors.New("mysql: snapshot file")

// snapFile is what a snapshot file says of itself.
type snapFile struct {
	at         resumePoint
	table, key string
	held       []string // the texts of the keys of the held deletions
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// writeSnapshotFile writes g with what it reflects to path, atomically: a
// temporary file in the same directory, synced, renamed over path, and the
// directory synced, so that a crash leaves the old file or the new one.
// It returns the bytes written.
func writeSnapshotFile(path string, h snapFile, g *guard.Guard) (int64, error) {
	hdr, err := h.marshal()
	if err != nil {
		return 0, err
	}
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

// marshal returns h's header bytes, checksum included, or an error for a
// field too long for the format.
func (h *snapFile) marshal() ([]byte, error) {
	p := &h.at
	b := make([]byte, 0, 256)
	b = append(b, snapFileMagic...)
	b = binary.LittleEndian.AppendUint16(b, snapFileVersion)
	b = binary.LittleEndian.AppendUint16(b, 0)
	for _, v := range []uint32{p.serverID, p.start, p.end, p.gtid.domain, p.gtid.server} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	b = binary.LittleEndian.AppendUint64(b, p.gtid.seq)
	b = binary.LittleEndian.AppendUint64(b, p.sum)
	fields := append([]string{p.file, p.pos.String(), h.table, h.key}, columnFields(p.col)...)
	if len(h.held) > 1<<31 {
		return nil, fmt.Errorf("%w: %d held deletions", errSnapshotFile, len(h.held))
	}
	for _, ss := range [][]string{fields, h.held} {
		for _, s := range ss {
			if len(s) >= 1<<16 {
				return nil, fmt.Errorf("%w: a field of %d bytes", errSnapshotFile, len(s))
			}
		}
	}
	for _, s := range fields {
		b = iox.AppendField16(b, s)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.held)))
	for _, s := range h.held {
		b = iox.AppendField16(b, s)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// columnFields are the fields of c, in their order in the file.
func columnFields(c column) []string {
	return []string{c.schema, c.table, c.name, strconv.Itoa(c.ordinal), strconv.Itoa(c.columns), c.dataType, c.columnType,
		c.charset, c.collation, strconv.FormatBool(c.nullable), c.engine, c.uniqueKey}
}

// columnOf is the column of fields (columnFields).
func columnOf(f []string) (column, error) {
	ord, err1 := strconv.Atoi(f[3])
	n, err2 := strconv.Atoi(f[4])
	null, err3 := strconv.ParseBool(f[9])
	if err := errors.Join(err1, err2, err3); err != nil {
		return column{}, err
	}
	return column{schema: f[0], table: f[1], name: f[2], ordinal: ord, columns: n, dataType: f[5], columnType: f[6],
		charset: f[7], collation: f[8], nullable: null, engine: f[10], uniqueKey: f[11]}, nil
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
	fixed, err := c.Bytes(8 + 5*4 + 2*8)
	if err != nil {
		return bad("header: %v", err)
	}
	if string(fixed[:4]) != snapFileMagic {
		return bad("not a MySQL follower's snapshot (magic %q)", fixed[:4])
	}
	if v := binary.LittleEndian.Uint16(fixed[4:]); v != snapFileVersion {
		return bad("version %d, want %d", v, snapFileVersion)
	}
	u32 := func(i int) uint32 { return binary.LittleEndian.Uint32(fixed[8+4*i:]) }
	var h snapFile
	p := &h.at
	p.serverID, p.start, p.end = u32(0), u32(1), u32(2)
	p.gtid = gtid{domain: u32(3), server: u32(4), seq: binary.LittleEndian.Uint64(fixed[28:])}
	p.sum = binary.LittleEndian.Uint64(fixed[36:])
	fields := make([]string, 4+12)
	for i := range fields {
		if fields[i], err = c.Field16(); err != nil {
			return bad("header: %v", err)
		}
	}
	nb, err := c.Bytes(4)
	if err != nil {
		return bad("header: %v", err)
	}
	for range binary.LittleEndian.Uint32(nb) {
		s, err := c.Field16()
		if err != nil {
			return bad("held deletions: %v", err)
		}
		h.held = append(h.held, s)
	}
	if err := c.Verify(castagnoli); err != nil {
		return bad("%v", err)
	}
	p.file, h.table, h.key = fields[0], fields[2], fields[3]
	if p.pos, err = parseGTIDPos(fields[1]); err != nil {
		return bad("%v", err)
	}
	if p.col, err = columnOf(fields[4:]); err != nil {
		return bad("key column: %v", err)
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
