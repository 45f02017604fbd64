package segment

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
)

// Record is one entry of the log.
type Record struct {
	Offset    uint64 // assigned by Append; ignored on input
	Timestamp int64  // unix milliseconds, set by the caller; clamped so it never decreases within a log
	Key       []byte // nil means no key; an empty non-nil key is stored as such
	Value     []byte // never nil on read
	Attrs     uint16 // caller-defined flags, stored verbatim
}

// Frame layout; README.md has the byte table.
const (
	frameVersion  = 1
	flagKey       = 1 << 0 // the record has a key (possibly empty)
	frameHeader   = 32     // length, crc, version, flags, attrs, offset, timestamp, key length
	frameOverhead = frameHeader + 4
	// minFrameBody is the smallest value of the length field: everything after it
	// for a record with no key and an empty value.
	minFrameBody = frameOverhead - 4
)

var (
	le         = binary.LittleEndian
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// frameSize is the number of bytes r occupies on disk.
func frameSize(r *Record) int { return frameOverhead + len(r.Key) + len(r.Value) }

// appendFrame appends the frame of r, stamped with off and ts, to b.
func appendFrame(b []byte, r *Record, off uint64, ts int64) []byte {
	n := frameSize(r)
	start := len(b)
	b = slices.Grow(b, n)[:start+n]
	f := b[start:]
	le.PutUint32(f[0:], uint32(n-4))
	f[8] = frameVersion
	f[9] = 0
	if r.Key != nil {
		f[9] = flagKey
	}
	le.PutUint16(f[10:], r.Attrs)
	le.PutUint64(f[12:], off)
	le.PutUint64(f[20:], uint64(ts))
	le.PutUint32(f[28:], uint32(len(r.Key)))
	p := frameHeader + copy(f[frameHeader:], r.Key)
	le.PutUint32(f[p:], uint32(len(r.Value)))
	copy(f[p+4:], r.Value)
	le.PutUint32(f[4:], crc32.Checksum(f[8:], castagnoli))
	return b
}

// frameError says why bytes at a position are not a valid record. incomplete
// marks a frame cut short by the end of the data, the signature of a torn tail.
type frameError struct {
	reason     string
	incomplete bool
}

func (e *frameError) Error() string { return "segment: corrupt record: " + e.reason }
func (e *frameError) Unwrap() error { return ErrCorrupt }

func corrupt(format string, args ...any) *frameError {
	return &frameError{reason: fmt.Sprintf(format, args...)}
}

// frameLength checks the length prefix at the start of b (at least 4 bytes) and
// returns the whole frame's size.
func frameLength(b []byte, maxRecord int) (int, error) {
	body := le.Uint32(b)
	if body < minFrameBody || uint64(body)+4 > uint64(maxRecord) {
		return 0, corrupt("length %d out of range", body)
	}
	return int(body) + 4, nil
}

// decodeRecord decodes the frame at the start of b. On success it returns the
// record, whose Key and Value alias b with their capacity cut to their length,
// and the frame's size. A frame running past the end of b is reported as an
// incomplete frameError.
func decodeRecord(b []byte, maxRecord int) (Record, int, error) {
	if len(b) < 4 {
		return Record{}, 0, &frameError{reason: "length prefix cut short", incomplete: true}
	}
	n, err := frameLength(b, maxRecord)
	if err != nil {
		return Record{}, 0, err
	}
	if len(b) < n {
		return Record{}, 0, &frameError{reason: fmt.Sprintf("frame of %d bytes cut short at %d", n, len(b)), incomplete: true}
	}
	rec, err := decodeFrame(b[:n])
	return rec, n, err
}

// decodeFrame decodes f, which is exactly one frame as sized by its length prefix.
func decodeFrame(f []byte) (Record, error) {
	if sum := crc32.Checksum(f[8:], castagnoli); sum != le.Uint32(f[4:]) {
		return Record{}, corrupt("checksum %08x, stored %08x", sum, le.Uint32(f[4:]))
	}
	if f[8] != frameVersion {
		return Record{}, corrupt("unknown version %d", f[8])
	}
	flags := f[9]
	if flags&^flagKey != 0 {
		return Record{}, corrupt("reserved flags %#x set", flags)
	}
	keyLen := uint64(le.Uint32(f[28:]))
	if flags&flagKey == 0 && keyLen != 0 {
		return Record{}, corrupt("key length %d without a key", keyLen)
	}
	if keyLen > uint64(len(f)-frameOverhead) {
		return Record{}, corrupt("key length %d past the frame", keyLen)
	}
	p := frameHeader + int(keyLen)
	if valLen := uint64(le.Uint32(f[p:])); uint64(p)+4+valLen != uint64(len(f)) {
		return Record{}, corrupt("value length %d does not fill the frame", valLen)
	}
	rec := Record{
		Offset:    le.Uint64(f[12:]),
		Timestamp: int64(le.Uint64(f[20:])),
		Attrs:     le.Uint16(f[10:]),
		Value:     f[p+4 : len(f) : len(f)],
	}
	if flags&flagKey != 0 {
		rec.Key = f[frameHeader:p:p]
	}
	return rec, nil
}
