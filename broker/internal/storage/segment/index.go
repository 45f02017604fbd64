package segment

import (
	"errors"
	"fmt"
	"hash/crc32"
	"sort"
)

// indexEntry points at one record of a segment. Entries are sparse (one per
// Options.IndexIntervalBytes of records) and ordered by offset, position and,
// because timestamps never decrease, by timestamp too.
type indexEntry struct {
	rel uint32 // offset minus the segment's base offset
	pos uint32 // file position of the record's frame
	ts  int64  // the record's timestamp
}

// seekOffset returns the entry to start scanning from to reach rel: the last
// one at or before it. entries must not be empty.
func seekOffset(entries []indexEntry, rel uint64) indexEntry {
	i := sort.Search(len(entries), func(i int) bool { return uint64(entries[i].rel) > rel })
	return entries[max(i-1, 0)]
}

// seekTime returns the entry to start scanning from to find the first record
// with a timestamp >= ts: the last one whose timestamp is below ts.
func seekTime(entries []indexEntry, ts int64) indexEntry {
	i := sort.Search(len(entries), func(i int) bool { return entries[i].ts >= ts })
	return entries[max(i-1, 0)]
}

// Index file layout; README.md has the byte table.
const (
	indexMagic     = "NRDIDX\x00\x01"
	indexHeader    = 48
	indexEntrySize = 16
	indexTrailer   = 4
)

// indexFile is the content of a sealed segment's .index file.
type indexFile struct {
	base    uint64 // the segment's base offset
	next    uint64 // one past its last record
	size    int64  // size of the .log file it describes
	lastTS  int64  // timestamp of its last record
	entries []indexEntry
}

func encodeIndex(ix *indexFile) []byte {
	b := make([]byte, indexHeader+indexEntrySize*len(ix.entries)+indexTrailer)
	copy(b, indexMagic)
	le.PutUint64(b[8:], ix.base)
	le.PutUint64(b[16:], ix.next)
	le.PutUint64(b[24:], uint64(ix.size))
	le.PutUint64(b[32:], uint64(ix.lastTS))
	le.PutUint32(b[40:], uint32(len(ix.entries)))
	p := indexHeader
	for _, e := range ix.entries {
		le.PutUint32(b[p:], e.rel)
		le.PutUint32(b[p+4:], e.pos)
		le.PutUint64(b[p+8:], uint64(e.ts))
		p += indexEntrySize
	}
	le.PutUint32(b[p:], crc32.Checksum(b[:p], castagnoli))
	return b
}

var errBadIndex = errors.New("segment: invalid index file")

// decodeIndex parses and checks an index file. It checks the file on its own;
// the caller compares base, next and size with the segment it describes.
func decodeIndex(b []byte) (*indexFile, error) {
	bad := func(why string) (*indexFile, error) { return nil, fmt.Errorf("%w: %s", errBadIndex, why) }
	if len(b) < indexHeader+indexTrailer || string(b[:8]) != indexMagic {
		return bad("no header")
	}
	n := int(le.Uint32(b[40:]))
	if (len(b)-indexHeader-indexTrailer)/indexEntrySize != n || (len(b)-indexHeader-indexTrailer)%indexEntrySize != 0 {
		return bad("entry count does not match the file size")
	}
	end := len(b) - indexTrailer
	if crc32.Checksum(b[:end], castagnoli) != le.Uint32(b[end:]) {
		return bad("checksum mismatch")
	}
	ix := &indexFile{
		base:    le.Uint64(b[8:]),
		next:    le.Uint64(b[16:]),
		size:    int64(le.Uint64(b[24:])),
		lastTS:  int64(le.Uint64(b[32:])),
		entries: make([]indexEntry, n),
	}
	for i := range ix.entries {
		p := indexHeader + i*indexEntrySize
		ix.entries[i] = indexEntry{rel: le.Uint32(b[p:]), pos: le.Uint32(b[p+4:]), ts: int64(le.Uint64(b[p+8:]))}
	}
	// A sealed segment is never empty, so its index starts at its first record.
	if n == 0 || ix.entries[0].rel != 0 || ix.entries[0].pos != 0 || ix.next <= ix.base || ix.size <= 0 {
		return bad("empty or not starting at the first record")
	}
	for i, e := range ix.entries {
		if uint64(e.rel) >= ix.next-ix.base || int64(e.pos) >= ix.size || e.ts > ix.lastTS ||
			(i > 0 && (e.rel <= ix.entries[i-1].rel || e.pos <= ix.entries[i-1].pos || e.ts < ix.entries[i-1].ts)) {
			return bad(fmt.Sprintf("entry %d out of order", i))
		}
	}
	return ix, nil
}
