package segment

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// request is one Append call waiting for the writer.
type request struct {
	recs  []Record
	size  int // encoded bytes
	first uint64
	err   error
	done  chan struct{}
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

// Append writes recs as consecutive offsets and returns the first one once every
// record is durable. Concurrent calls share fsyncs: while one group is being
// written and synced, arriving calls queue and are committed together by the
// next group. A record larger than Options.MaxRecordBytes fails the whole call
// with ErrRecordTooLarge and writes nothing. A failed write or fsync fails this
// call and every later one with an error wrapping ErrFailed; records of a failed
// call are never returned by Read. After Close, Append returns ErrClosed. recs is
// not modified and may be reused once Append returns; an empty recs commits
// nothing and returns Next.
func (l *Log) Append(recs []Record) (first uint64, err error) {
	size := 0
	for i := range recs {
		n := frameSize(&recs[i])
		if n > l.opts.MaxRecordBytes {
			return 0, fmt.Errorf("%w: record %d is %d bytes encoded, the limit is %d", ErrRecordTooLarge, i, n, l.opts.MaxRecordBytes)
		}
		size += n
	}
	req := requestPool.Get().(*request)
	req.recs, req.size = recs, size
	l.sendMu.RLock()
	if l.sendClosed {
		l.sendMu.RUnlock()
		requestPool.Put(req)
		return 0, ErrClosed
	}
	l.queue <- req
	l.sendMu.RUnlock()
	<-req.done
	first, err = req.first, req.err
	*req = request{done: req.done}
	requestPool.Put(req)
	return first, err
}

// run is the writer goroutine: it takes every request queued, commits them as
// one group and answers them, until Close closes the queue.
func (l *Log) run() {
	defer close(l.done)
	var group []*request
	for req := range l.queue {
		// Callers answered by the previous group are runnable but may not have
		// run yet; yielding once lets those that append again join this group
		// instead of the next one. With 16 one-record appenders this nearly
		// doubles the records per fsync, for well under a microsecond.
		runtime.Gosched()
		group = append(group[:0], req)
		size := req.size
	collect:
		for size < maxGroupBytes {
			select {
			case r, ok := <-l.queue:
				if !ok {
					break collect
				}
				group = append(group, r)
				size += r.size
			default:
				break collect
			}
		}
		l.fileMu.Lock()
		sealed, err := l.commit(group, size)
		if err == nil && l.opts.RecoveryPointEvery > 0 && time.Since(l.rpAt) >= l.opts.RecoveryPointEvery {
			// Before the answers, so that whoever sees an append return also sees every
			// fsync it caused; it costs one group one more fsync at most once a period
			// (none with a write-ahead file: writePeriodicPoint).
			l.writePeriodicPoint()
		}
		l.fileMu.Unlock()
		for _, r := range group {
			r.err = err
			r.done <- struct{}{}
		}
		clear(group)
		if len(sealed) > 0 {
			// Off the acknowledgement path: a missing index only costs a scan on Open.
			l.fileMu.Lock()
			for _, s := range sealed {
				if !s.deleted.Load() && !s.holes {
					l.writeIndex(s)
				}
			}
			l.fileMu.Unlock()
		}
	}
}

// chunk is the part of a commit group that goes into one segment file.
type chunk struct {
	seg        *segment
	created    bool   // the group creates this segment's file
	pos        int64  // where the chunk starts in the file (the durable size before the group)
	start, end int    // span in Log.wbuf
	eStart     int    // first new index entry in Log.pending
	eEnd       int    // one past the last
	next       uint64 // segment's next offset after the group
	size       int64  // segment's size after the group
	lastTS     int64  // segment's newest timestamp after the group
	indexedAt  int64  // segment's last index entry position after the group
}

// keptGroupBuffer is the largest write buffer a log keeps for its next commit group.
// A larger one goes back to groupBuffers, which every log of the process shares and
// the garbage collector empties when it goes unused: a log kept its largest group's
// buffer (up to maxGroupBytes) for as long as it was open, so a node whose partitions
// had each taken a few batches of 1,000 messages held about 300 KB a partition for
// good (60 MB over 200 partitions).
const keptGroupBuffer = 64 << 10

var groupBuffers sync.Pool // of *[]byte, each larger than keptGroupBuffer

// releaseBuffer lets a large write buffer go after its group is committed (nothing
// holds it then: the write-ahead file keeps no span's data after Commit).
func (l *Log) releaseBuffer() {
	switch c := cap(l.wbuf); {
	case c > maxGroupBytes:
		l.wbuf = nil // one huge Append's buffer is not worth keeping anywhere
	case c > keptGroupBuffer:
		b := l.wbuf[:0]
		groupBuffers.Put(&b)
		l.wbuf = nil
	}
	clear(l.spans[:cap(l.spans)]) // no stale span may keep a pooled buffer alive
}

// commit writes the records of group, fsyncs them and then makes them visible to
// readers. It returns the segments the group sealed by rolling to a new one.
// l.fileMu must be held.
func (l *Log) commit(group []*request, size int) ([]*segment, error) {
	if l.failErr != nil {
		return nil, l.failErr
	}
	if cap(l.wbuf) < size && size > keptGroupBuffer {
		if b, ok := groupBuffers.Get().(*[]byte); ok {
			l.wbuf = *b
		}
	}
	l.wbuf = slices.Grow(l.wbuf[:0], size)
	l.chunks, l.pending = l.chunks[:0], l.pending[:0]
	active := l.segments[len(l.segments)-1]
	c := chunk{seg: active, pos: active.size, size: active.size, next: active.next, lastTS: active.lastTS, indexedAt: active.indexedAt}
	first := active.next
	off, ts := first, l.lastTS
	for _, r := range group {
		r.first = off
		for i := range r.recs {
			rec := &r.recs[i]
			n := frameSize(rec)
			if c.size > 0 && c.size+int64(n) > l.opts.SegmentBytes {
				c.end, c.eEnd = len(l.wbuf), len(l.pending)
				l.chunks = append(l.chunks, c)
				c = chunk{seg: newSegment(l.dir, off), created: true, start: len(l.wbuf), eStart: len(l.pending), next: off}
			}
			ts = max(rec.Timestamp, ts)
			if c.size == 0 || c.size-c.indexedAt >= int64(l.opts.IndexIntervalBytes) {
				l.pending = append(l.pending, indexEntry{rel: uint32(off - c.seg.base), pos: uint32(c.size), ts: ts})
				c.indexedAt = c.size
			}
			l.wbuf = appendFrame(l.wbuf, rec, off, ts)
			off++
			c.next, c.size, c.lastTS = off, c.size+int64(n), ts
		}
	}
	c.end, c.eEnd = len(l.wbuf), len(l.pending)
	l.chunks = append(l.chunks, c)

	if l.opts.WAL != nil && !l.opts.NoSync {
		if err := l.writeChunksWAL(); err != nil {
			return nil, err
		}
	} else {
		for i := range l.chunks {
			if err := l.writeChunk(&l.chunks[i]); err != nil {
				return nil, l.fail(l.chunks[:i+1], err)
			}
		}
	}
	failpoint.Inject(failpoint.SegmentAfterFsync)

	l.mu.Lock()
	for i := range l.chunks {
		c := &l.chunks[i]
		s := c.seg
		if !c.created && len(s.entries) == 0 && c.eEnd > c.eStart {
			l.boundDamaged(l.pending[c.eStart].ts)
		}
		s.entries = append(s.entries, l.pending[c.eStart:c.eEnd]...)
		s.next, s.size, s.lastTS, s.indexedAt = c.next, c.size, c.lastTS, c.indexedAt
		if c.created {
			l.segments = append(l.segments, s)
		}
	}
	l.mu.Unlock()
	l.lastTS = ts
	l.stats.records.Add(off - first)
	l.stats.bytes.Add(uint64(len(l.wbuf)))
	if len(l.wbuf) > 0 {
		l.stats.groups.Add(1)
	}
	l.releaseBuffer()
	sealed := make([]*segment, 0, len(l.chunks)-1)
	for _, c := range l.chunks[:len(l.chunks)-1] {
		sealed = append(sealed, c.seg)
	}
	return sealed, nil
}

// boundDamaged gives a damaged sealed segment just before the active one, whose age was
// unknown because nothing followed it, the bound ts of the first record appended after
// it (or its last valid record's, if later): without it, it would never age out while
// the process runs. Its valid records are all older than the bound, so retention never
// removes a record that could be served before its time. l.mu must be held.
func (l *Log) boundDamaged(ts int64) {
	if n := len(l.segments); n >= 2 {
		if prev := l.segments[n-2]; prev.damaged && prev.lastTS == math.MaxInt64 {
			prev.lastTS = max(ts, prev.validTS)
		}
	}
}

// writeChunk writes one chunk and fsyncs it. A new segment's file is created,
// and its directory entry made durable, only after everything before it was
// synced, so a crash can never leave a later segment behind a torn one.
func (l *Log) writeChunk(c *chunk) error {
	if c.start == c.end {
		return nil
	}
	if err := l.writeChunkData(c); err != nil {
		return err
	}
	if !l.opts.NoSync {
		l.stats.syncs.Add(1)
	}
	return l.sync(c.seg.f)
}

// writeChunkData creates the chunk's segment file if the chunk starts it (its
// directory entry durable) and writes the chunk's bytes, without a sync.
func (l *Log) writeChunkData(c *chunk) error {
	if c.created {
		f, err := l.fs.OpenFile(c.seg.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return &writeError{err}
		}
		c.seg.f = f
		failpoint.Inject(failpoint.SegmentRollCreated)
		if err := l.syncDir(); err != nil {
			return err
		}
	}
	if _, err := c.seg.f.WriteAt(l.wbuf[c.start:c.end], c.pos); err != nil {
		return &writeError{err}
	}
	return failpoint.Err(failpoint.SegmentAfterWrite)
}

// writeChunksWAL writes the group's chunks and makes them durable with one commit
// to the node's write-ahead file instead of a sync of each segment file. A chunk
// that starts a new segment is preceded by a commit of the chunks before it, so that,
// as with syncs, a later segment never exists behind a torn one.
func (l *Log) writeChunksWAL() error {
	l.spans = l.spans[:0]
	committed := false
	commit := func(upTo int) error {
		if len(l.spans) == 0 {
			return nil
		}
		err := l.opts.WAL.Commit(l.spans)
		l.spans = l.spans[:0]
		if err != nil {
			if !committed && errors.Is(err, wal.ErrNotWritten) {
				// Nothing of the group is in the write-ahead file: undo as after a
				// failed write (the log stays open if that was for want of space).
				return l.fail(l.chunks[:upTo], &writeError{err})
			}
			// The records may be replayed: they cannot be taken back.
			l.failErr = fmt.Errorf("%w: %w", ErrFailed, err)
			return fmt.Errorf("%w: %w", ErrNotUndone, l.failErr)
		}
		l.stats.syncs.Add(1)
		committed = true
		return nil
	}
	for i := range l.chunks {
		c := &l.chunks[i]
		if c.start == c.end {
			continue
		}
		if c.created {
			if err := commit(i); err != nil {
				return err
			}
		}
		if err := l.writeChunkData(c); err != nil {
			if committed {
				l.failErr = fmt.Errorf("%w: %w", ErrFailed, err)
				return fmt.Errorf("%w: %w", ErrNotUndone, l.failErr)
			}
			return l.fail(l.chunks[:i+1], err)
		}
		l.spans = append(l.spans, wal.Span{Path: c.seg.path, Off: c.pos, Data: l.wbuf[c.start:c.end]})
	}
	return commit(len(l.chunks))
}

// fail fails the log closed after a write or fsync error and tries to take the
// touched files back to their durable state, so that a reopen does not show the
// failed group. The undo stops at its first error, leaving at worst a
// consistent log that holds some unacknowledged records: the group's callers then
// get ErrNotUndone, since those records may be read after a reopen.
func (l *Log) fail(touched []chunk, cause error) error {
	l.failErr = fmt.Errorf("%w: %w", ErrFailed, cause)
	undone := true
	defer func() {
		// A write (not an fsync) that ran out of space, fully undone, leaves the files
		// exactly as durable as before the group: the log may stay open.
		var we *writeError
		if undone && errors.As(cause, &we) && errors.Is(cause, syscall.ENOSPC) {
			l.failErr = nil
		}
	}()
	for i := len(touched) - 1; i >= 0; i-- {
		c := &touched[i]
		err := failpoint.Err(failpoint.SegmentUndo) // stands for a failed truncate or remove
		switch {
		case err != nil:
		case c.created:
			if c.seg.f != nil {
				_ = c.seg.f.Close() // the append failed; its error is the one reported
				c.seg.f = nil
			}
			if err = l.fs.Remove(c.seg.path); err == nil || errors.Is(err, fs.ErrNotExist) {
				err = l.syncDir()
			}
		default:
			if err = c.seg.f.Truncate(c.pos); err == nil {
				err = l.sync(c.seg.f)
			}
		}
		if err != nil {
			undone = false
			break
		}
	}
	var we *writeError
	if undone && errors.As(cause, &we) && errors.Is(cause, syscall.ENOSPC) {
		return fmt.Errorf("%w: %w", ErrNoSpace, cause)
	}
	if !undone {
		// The group's callers must not be told that nothing was stored.
		return fmt.Errorf("%w: %w", ErrNotUndone, l.failErr)
	}
	return l.failErr
}

// writeError marks an error of creating or writing a file, as opposed to an fsync:
// only such an error, when it is ENOSPC, leaves the log usable.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }
