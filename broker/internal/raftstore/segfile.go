package raftstore

import (
	"errors"
	"fmt"
	"io"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// segFile is one segment file: the entries from base on, one frame each, back to
// back. Only the last segment of a store is written; every other one is sealed and
// ends exactly where the next begins.
type segFile struct {
	base uint64
	path string
	f    vfs.File
	pos  []uint32 // pos[i] is the byte offset of entry base+i's frame
	size int64    // end of the last frame written
}

// next is the index one past the segment's last entry.
func (s *segFile) next() uint64 { return s.base + uint64(len(s.pos)) }

// frameEnd is where entry base+i's frame ends.
func (s *segFile) frameEnd(i int) int64 {
	if i+1 < len(s.pos) {
		return int64(s.pos[i+1])
	}
	return s.size
}

// termRun says that the entries from index on have term, up to the next run.
type termRun struct{ index, term uint64 }

// window reads a file sequentially in large chunks, so a scan costs one ReadAt per
// chunk instead of two per frame.
type window struct {
	f    vfs.File
	size int64
	buf  []byte
	off  int64
	n    int
}

const windowBytes = 1 << 20

// bytes returns up to n bytes at pos (fewer only at the end of the file).
func (w *window) bytes(pos int64, n int) ([]byte, error) {
	if pos >= w.off && pos+int64(n) <= w.off+int64(w.n) {
		return w.buf[pos-w.off : pos-w.off+int64(n)], nil
	}
	want := int64(max(n, windowBytes))
	want = min(want, w.size-pos)
	if want <= 0 {
		return nil, nil
	}
	if int64(cap(w.buf)) < want {
		w.buf = make([]byte, want)
	}
	w.buf = w.buf[:want]
	got, err := w.f.ReadAt(w.buf, pos)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	w.off, w.n = pos, got
	return w.buf[:min(got, n)], nil
}

// scanResult is what a scan of one segment found.
type scanResult struct {
	pos      []uint32
	runs     []termRun // term changes, the first at base (empty if no entries)
	end      int64     // end of the last good frame
	lastTerm uint64
	bad      string // why the frame at end is not good; "" if the scan reached the file's end
	// validAfter: a whole, valid frame with a later index starts after the bad
	// bytes, so they held records that were once written in full.
	validAfter bool
}

// scanSegment reads a segment's frames from the start: each must be whole, pass its
// CRC, carry the next index and a term no lower than the one before (prevTerm for
// the first). It stops at the first frame that does not.
func scanSegment(f vfs.File, name string, base uint64, size int64, maxEntry int, prevTerm uint64) (scanResult, error) {
	r := scanResult{lastTerm: prevTerm}
	w := &window{f: f, size: size}
	idx := base
	var pos int64
	for pos < size {
		if size-pos < headerBytes {
			r.bad = "incomplete frame header"
			break
		}
		hb, err := w.bytes(pos, headerBytes)
		if err != nil {
			return r, err
		}
		h, _, ok := checkFrame(hb, maxEntry)
		if !ok {
			r.bad = fmt.Sprintf("frame length %d over the limit", h.n)
			break
		}
		if pos+headerBytes+int64(h.n) > size {
			r.bad = "frame runs past the end of the file"
			break
		}
		fb, err := w.bytes(pos, headerBytes+h.n)
		if err != nil {
			return r, err
		}
		if _, _, ok := checkFrame(fb, maxEntry); !ok {
			r.bad = "CRC mismatch"
			break
		}
		if h.index != idx {
			r.bad = fmt.Sprintf("frame holds index %d where %d belongs", h.index, idx)
			break
		}
		if h.term < r.lastTerm {
			r.bad = fmt.Sprintf("term %d after term %d", h.term, r.lastTerm)
			break
		}
		if pos > 1<<32-1 {
			return r, fmt.Errorf("%w: %s: frame at offset %d past 4 GiB", ErrCorrupt, name, pos)
		}
		if len(r.runs) == 0 || r.runs[len(r.runs)-1].term != h.term {
			r.runs = append(r.runs, termRun{index: idx, term: h.term})
		}
		r.pos = append(r.pos, uint32(pos))
		r.lastTerm = h.term
		idx++
		pos += headerBytes + int64(h.n)
	}
	r.end = pos
	if r.bad != "" {
		va, err := validFrameAfter(w, pos, idx, maxEntry)
		if err != nil {
			return r, err
		}
		r.validAfter = va
	}
	return r, nil
}

// validFrameAfter looks past bad bytes at from for a whole frame that passes its CRC
// and carries an index no lower than want (and no higher than the bytes skipped
// could have held). Finding one means the bad bytes are damage inside data that was
// written and synced in full, not a write torn by a crash.
func validFrameAfter(w *window, from int64, want uint64, maxEntry int) (bool, error) {
	for q := from + 1; q+headerBytes <= w.size; q++ {
		hb, err := w.bytes(q, headerBytes)
		if err != nil {
			return false, err
		}
		h, _, ok := checkFrame(hb, maxEntry)
		if !ok || h.index < want || h.index > want+uint64(q-from)/headerBytes+1 || q+headerBytes+int64(h.n) > w.size {
			continue
		}
		fb, err := w.bytes(q, headerBytes+h.n)
		if err != nil {
			return false, err
		}
		if _, whole, ok := checkFrame(fb, maxEntry); whole && ok {
			return true, nil
		}
	}
	return false, nil
}
