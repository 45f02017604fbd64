package segment

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

const (
	logExt   = ".log"
	indexExt = ".index"
	tmpExt   = ".tmp"
)

// segmentName is the file name of the segment starting at base: 20 digits, so
// names sort like offsets.
func segmentName(base uint64, ext string) string { return fmt.Sprintf("%020d%s", base, ext) }

// parseSegmentName returns the base offset encoded in name if it is a segment
// file name with extension ext.
func parseSegmentName(name, ext string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, ext)
	if !ok || len(digits) != 20 || strings.Trim(digits, "0123456789") != "" {
		return 0, false
	}
	base, err := strconv.ParseUint(digits, 10, 64)
	return base, err == nil
}

// segment is one .log file of a Log and its sparse in-memory index.
type segment struct {
	// Guarded by Log.mu: changed under its write lock once data is durable (or,
	// for base and path, by SetNext), copied by readers under its read lock.
	base    uint64
	path    string
	next    uint64       // one past the last record; for a sealed segment, the next segment's base
	size    int64        // bytes of durable records (sealed: the file size)
	lastTS  int64        // newest timestamp (math.MinInt64 when empty; an upper bound when damaged)
	entries []indexEntry // appended to, never changed
	damaged bool         // sealed, and its last records failed their checks: lastTS is only a bound
	validTS int64        // damaged: the timestamp of its last valid record (a lower bound of the real one)
	// holes: some records failed their checks when the segment was scanned on Open; such a
	// segment gets no index file, so the damage is found and reported again at every Open.
	holes bool

	indexedAt int64 // position of the last index entry; used by the writer only

	// refs counts the log's own reference plus one per reader using the file;
	// whoever drops it to zero closes the file.
	refs    atomic.Int32
	deleted atomic.Bool // removed by retention; its file may be gone

	fmu sync.Mutex
	f   vfs.File // opened lazily for sealed segments
}

func newSegment(dir string, base uint64) *segment {
	s := &segment{base: base, path: filepath.Join(dir, segmentName(base, logExt)), next: base, lastTS: math.MinInt64}
	s.refs.Store(1)
	return s
}

func (s *segment) indexPath() string { return strings.TrimSuffix(s.path, logExt) + indexExt }

// errSegmentGone means a reader lost the race with retention for a segment.
var errSegmentGone = errors.New("segment: deleted")

// file returns the segment's open file, opening it read-only on first use.
func (s *segment) file(fsys vfs.FS, path string) (vfs.File, error) {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if s.f != nil {
		return s.f, nil
	}
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		if s.deleted.Load() && errors.Is(err, fs.ErrNotExist) {
			return nil, errSegmentGone
		}
		return nil, err
	}
	s.f = f
	return f, nil
}

// release drops one reference and closes the file with the last one.
func (s *segment) release() error {
	if s.refs.Add(-1) != 0 {
		return nil
	}
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

// frameReader reads consecutive frames of one segment file and checks each one:
// length, CRC, format and that offsets follow each other.
type frameReader struct {
	f     vfs.File
	end   int64  // bytes that may be read
	pos   int64  // position of the next frame
	off   uint64 // offset the next frame must carry
	max   int    // Options.MaxRecordBytes
	chunk int    // preferred size of one ReadAt
	fresh bool   // give every read its own buffer, so returned records may keep aliasing it
	buf   []byte // bytes read from the file
	at    int64  // file position of buf[0]
}

// next decodes the frame at r.pos. It returns io.EOF at r.end, a *frameError
// (matching ErrCorrupt) for bytes that are not the expected record, and any
// other error for failed I/O.
func (r *frameReader) next() (Record, int, error) {
	if r.pos >= r.end {
		return Record{}, 0, io.EOF
	}
	b, err := r.window(4)
	if err != nil {
		return Record{}, 0, err
	}
	n, err := frameLength(b, r.max)
	if err != nil {
		return Record{}, 0, err
	}
	if b, err = r.window(n); err != nil {
		return Record{}, 0, err
	}
	rec, err := decodeFrame(b[:n])
	if err != nil {
		return Record{}, 0, err
	}
	if rec.Offset != r.off {
		return Record{}, 0, corrupt("offset %d where %d was expected", rec.Offset, r.off)
	}
	r.pos += int64(n)
	r.off++
	return rec, n, nil
}

// window returns the bytes from r.pos on, at least n of them, reading if needed.
func (r *frameReader) window(n int) ([]byte, error) {
	if r.pos >= r.at && r.pos+int64(n) <= r.at+int64(len(r.buf)) {
		return r.buf[r.pos-r.at:], nil
	}
	if r.end-r.pos < int64(n) {
		return nil, &frameError{reason: fmt.Sprintf("frame at byte %d needs %d bytes, %d left", r.pos, n, r.end-r.pos), incomplete: true}
	}
	want := int(min(int64(max(n, r.chunk)), r.end-r.pos))
	buf := r.buf
	if r.fresh || cap(buf) < want {
		buf = make([]byte, want)
	}
	buf = buf[:want]
	got, err := r.f.ReadAt(buf, r.pos)
	if got < want {
		if err == nil || err == io.EOF {
			return nil, &frameError{reason: fmt.Sprintf("file ends before byte %d", r.pos+int64(want)), incomplete: true}
		}
		return nil, err
	}
	r.buf, r.at = buf, r.pos
	return buf, nil
}

// resync looks past a frame that failed its checks for the next good one: from the byte
// after r.pos on, the first position holding a whole frame that passes every check and
// carries an offset in [r.off, hi]. A frame n offsets further on must lie at least n
// minimal frames further on, so a candidate's offset is also bounded by its distance;
// together with the CRC this makes it practically impossible to take bytes inside a
// damaged record for a record. On success r stands at that frame and true is returned; on
// false r stands where it started. Only I/O errors are returned as errors.
func (r *frameReader) resync(hi uint64) (bool, error) {
	start, lo := r.pos, r.off
	chunk := r.chunk
	r.chunk = max(r.chunk, 64<<10)
	defer func() { r.chunk = chunk }()
	for p := start + 1; p+frameOverhead <= r.end; p++ {
		r.pos = p
		b, err := r.window(frameOverhead)
		if err != nil {
			var ferr *frameError
			if errors.As(err, &ferr) {
				break
			}
			r.pos = start
			return false, err
		}
		off := le.Uint64(b[12:])
		if b[8] != frameVersion || off < lo || off > hi || off-lo > uint64(p-start)/frameOverhead {
			continue
		}
		n, err := frameLength(b, r.max)
		if err != nil || int64(n) > r.end-p {
			continue
		}
		if b, err = r.window(n); err != nil {
			var ferr *frameError
			if errors.As(err, &ferr) {
				continue
			}
			r.pos = start
			return false, err
		}
		if _, err := decodeFrame(b[:n]); err == nil {
			r.off = off
			return true, nil
		}
	}
	r.pos = start
	return false, nil
}

// Damage is a run of offsets [From, To) whose records failed their checks, found by
// the scan of a segment on Open. The offsets stay taken: reading them fails with
// ErrCorrupt, the records around them are served, and no new record ever gets them.
type Damage struct {
	From, To uint64
}

// scanResult is what a scan of a segment file found.
type scanResult struct {
	next      uint64 // one past the last valid record
	size      int64  // end of the last valid record
	lastTS    int64
	entries   []indexEntry
	indexedAt int64
	holes     []Damage // damaged runs with valid records after them
	resynced  bool     // bytes that are no record were skipped (holes, or garbage between records)
	stop      error    // the *frameError that ended the scan early, or nil
}

// forceIndexEntry as an indexedAt makes the next record get an index entry whatever
// its position, so a reader seeking it or anything after it never starts before a
// damaged record.
const forceIndexEntry = math.MinInt64 / 2

// scanSegment checks the records of a segment file from its start, up to end
// bytes or until offset limit, and rebuilds its sparse index. A frame that fails
// its checks is skipped if a valid frame with a later, consistent offset follows
// it: the offsets in between are reported in holes, and the record after them gets
// an index entry. Only I/O errors are returned as errors; invalid bytes with no
// valid frame after them end the scan and are reported in stop, and so does any
// frame that fails its checks at byte cutAt or later (math.MaxInt64: none).
func scanSegment(f vfs.File, base uint64, end int64, limit uint64, cutAt int64, opts *Options) (scanResult, error) {
	res := scanResult{next: base, lastTS: math.MinInt64}
	r := frameReader{f: f, end: end, off: base, max: opts.MaxRecordBytes, chunk: 1 << 20}
	for r.off < limit {
		pos := r.pos
		if pos > math.MaxUint32 || r.off-base >= math.MaxUint32 {
			res.stop = corrupt("segment larger than the index can address")
			break
		}
		rec, _, err := r.next()
		if err == io.EOF {
			break
		}
		var ferr *frameError
		if errors.As(err, &ferr) && pos >= cutAt {
			res.stop = ferr
			break
		}
		if errors.As(err, &ferr) {
			from := r.off
			found, err := r.resync(limit - 1)
			if err != nil {
				return res, err
			}
			if !found {
				res.stop = ferr
				break
			}
			if r.off > from {
				res.holes = append(res.holes, Damage{From: from, To: r.off})
			}
			res.resynced = true
			res.indexedAt = forceIndexEntry
			continue
		}
		if err != nil {
			return res, err
		}
		ts := max(rec.Timestamp, res.lastTS) // stored timestamps never decrease; keep the index ordered even if they did
		if len(res.entries) == 0 || pos-res.indexedAt >= int64(opts.IndexIntervalBytes) {
			res.entries = append(res.entries, indexEntry{rel: uint32(rec.Offset - base), pos: uint32(pos), ts: ts})
			res.indexedAt = pos
		}
		res.lastTS = ts
		res.next, res.size = r.off, r.pos
	}
	return res, nil
}
