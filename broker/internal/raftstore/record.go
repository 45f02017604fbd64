package raftstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"strconv"
	"strings"

	"go.etcd.io/raft/v3/raftpb"
)

// A segment file holds consecutive Raft entries as frames, all integers
// little-endian:
//
//	u32 payload length N | u32 CRC-32C of bytes 8…24+N | u64 index | u64 term | N bytes: the marshalled raftpb.Entry
//
// The index and term sit in the header so that recovery can check order and build
// the term table without unmarshalling a payload, and so a payload that decodes to
// another index or term is caught as damage.
const (
	headerBytes = 24
	segExt      = ".raft"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// segmentName is the file holding the entries from base on: 20 zero-padded digits,
// so names sort like indexes.
func segmentName(base uint64) string { return fmt.Sprintf("%020d%s", base, segExt) }

func parseSegmentName(name string) (uint64, bool) {
	s, ok := strings.CutSuffix(name, segExt)
	if !ok || len(s) != 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

func segmentPath(dir string, base uint64) string { return filepath.Join(dir, segmentName(base)) }

// appendFrame encodes e as one frame at the end of b.
func appendFrame(b []byte, e *raftpb.Entry) []byte {
	n := e.Size()
	start := len(b)
	b = append(b, make([]byte, headerBytes+n)...)
	f := b[start:]
	binary.LittleEndian.PutUint32(f[0:], uint32(n))
	binary.LittleEndian.PutUint64(f[8:], e.Index)
	binary.LittleEndian.PutUint64(f[16:], e.Term)
	_, _ = e.MarshalTo(f[headerBytes:]) // sized above; gogo's MarshalTo cannot fail then
	binary.LittleEndian.PutUint32(f[4:], crc32.Checksum(f[8:], castagnoli))
	return b
}

// frameHeader is the decoded fixed part of a frame.
type frameHeader struct {
	n     int // payload bytes
	index uint64
	term  uint64
}

// checkFrame decodes the frame at the start of b, which holds at least its header,
// and checks its CRC if the whole frame is in b. whole reports whether it was; a
// frame that is not whole needs more bytes (or is torn).
func checkFrame(b []byte, maxEntry int) (h frameHeader, whole bool, ok bool) {
	n := binary.LittleEndian.Uint32(b[0:])
	if n > uint32(maxEntry) {
		return h, false, false
	}
	h = frameHeader{n: int(n), index: binary.LittleEndian.Uint64(b[8:]), term: binary.LittleEndian.Uint64(b[16:])}
	if len(b) < headerBytes+h.n {
		return h, false, true
	}
	if crc32.Checksum(b[8:headerBytes+h.n], castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return h, true, false
	}
	return h, true, true
}

// decodeFrame decodes a whole, CRC-checked frame's entry and checks that it is the
// entry its header claims.
func decodeFrame(f []byte, h frameHeader) (raftpb.Entry, error) {
	var e raftpb.Entry
	if err := e.Unmarshal(f[headerBytes : headerBytes+h.n]); err != nil {
		return e, err
	}
	if e.Index != h.index || e.Term != h.term {
		return e, fmt.Errorf("entry says index %d term %d, header says %d/%d", e.Index, e.Term, h.index, h.term)
	}
	return e, nil
}
