package segment

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"slices"

	"github.com/narad-mq/narad/broker/internal/failpoint"
)

// DeleteOlderThan removes the oldest sealed segments whose newest record is
// older than cutoffMs (unix milliseconds), stopping at the first segment that
// is not; the active segment is never removed, so call Roll first to let an idle
// log age out completely. It returns how many records were removed; Oldest moves
// forward by as much.
func (l *Log) DeleteOlderThan(cutoffMs int64) (removed uint64, err error) {
	return l.deleteWhile(func(s *segment) bool { return s.lastTS < cutoffMs })
}

// DeleteBefore removes the oldest sealed segments whose records all lie below
// offset, for compacting a journal whose entries before offset are no longer
// needed. Records at or above offset are always kept. It returns how many
// records were removed.
func (l *Log) DeleteBefore(offset uint64) (removed uint64, err error) {
	return l.deleteWhile(func(s *segment) bool { return s.next <= offset })
}

// deleteWhile removes sealed segments from the front of the log while drop
// approves them. The in-memory list changes first, so no new reader finds a
// removed segment; readers already inside one finish on its open file.
func (l *Log) deleteWhile(drop func(*segment) bool) (uint64, error) {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	if err := l.usable(); err != nil {
		return 0, err
	}
	l.mu.Lock()
	n := 0
	for n < len(l.segments)-1 && drop(l.segments[n]) {
		n++
	}
	victims := l.segments[:n:n]
	l.segments = slices.Clone(l.segments[n:])
	empty := len(l.segments) == 1 && l.segments[0].next == l.segments[0].base
	l.mu.Unlock()
	if n == 0 {
		return 0, nil
	}
	if empty {
		// No record will be left to say how far timestamps went: the recovery point
		// keeps that before the last ones go, so a restart with its clock behind
		// never stamps a record older than one already handed out.
		l.writeRecoveryPoint()
	}

	var removed uint64
	var err error
	for _, s := range victims {
		s.deleted.Store(true)
		removed += s.next - s.base
		if err == nil {
			err = l.removeSegmentFiles(s)
		}
		failpoint.Inject(failpoint.SegmentRetentionDelete)
		_ = s.release() // the segment is deleted; closing its last reference frees the descriptor
	}
	return removed, err
}

// removeSegmentFiles unlinks a deleted segment's files. The log file goes first:
// an index left behind is removed on Open, while a log left without its index
// would only be scanned. Each segment's removal is made durable before the next
// one starts, so a crash can only leave a prefix of the log deleted, never a
// hole in the middle of it.
func (l *Log) removeSegmentFiles(s *segment) error {
	for _, p := range []string{s.path, s.indexPath()} {
		if err := l.fs.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		failpoint.Inject(failpoint.SegmentRetentionUnlink)
	}
	return l.syncDir()
}

// Roll seals the active segment and starts a new, empty one at Next, so that
// retention can remove everything written so far. It does nothing when the
// active segment is empty. A failure fails the log closed, like a failed append.
func (l *Log) Roll() error {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	active := l.segments[len(l.segments)-1]
	if active.next == active.base {
		return nil
	}
	s, err := l.createSegment(active.next)
	if err != nil {
		l.failErr = fmt.Errorf("%w: roll: %w", ErrFailed, err)
		return l.failErr
	}
	l.mu.Lock()
	l.segments = append(l.segments, s)
	l.mu.Unlock()
	if !active.holes {
		l.writeIndex(active)
	}
	return nil
}

// SetNext makes the next appended record get offset n. It is allowed only on a
// log that holds no records (ErrNotEmpty otherwise) and only forwards: n below
// Next fails with ErrOffsetOutOfRange, because offsets once handed out must
// never be reused. A log whose records all aged out keeps its empty active
// segment, whose name records Next across restarts; SetNext renames that file.
func (l *Log) SetNext(n uint64) error {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	active := l.segments[len(l.segments)-1]
	switch {
	case len(l.segments) > 1 || active.next != active.base:
		return fmt.Errorf("%w: SetNext(%d) with records from %d to %d", ErrNotEmpty, n, l.segments[0].base, active.next)
	case n < active.base:
		return fmt.Errorf("%w: SetNext(%d) would move offsets back from %d", ErrOffsetOutOfRange, n, active.base)
	case n > math.MaxInt64:
		return fmt.Errorf("%w: SetNext(%d) is above 2^63-1", ErrOffsetOutOfRange, n)
	case n == active.base:
		return nil
	}
	path := filepath.Join(l.dir, segmentName(n, logExt))
	if err := l.fs.Rename(active.path, path); err != nil {
		return err
	}
	l.mu.Lock()
	active.base, active.next, active.path = n, n, path
	l.mu.Unlock()
	if err := l.syncDir(); err != nil {
		l.failErr = fmt.Errorf("%w: SetNext: %w", ErrFailed, err)
		return l.failErr
	}
	return nil
}

// Flush makes every record appended so far durable, with the directory entries of
// the segment files, even in a log opened with NoSync: a replica's log is written
// without its own fsync (its group's log is replayed instead) until the group drops
// entries from its own log, and then what they wrote must be on disk. A NoSync log
// then records how far that is (the flush point, recovery.go).
func (l *Log) Flush() error {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	if l.opts.NoSync && l.fp.valid && l.activePoint() == l.fp.rp {
		// Nothing appended, rolled or reset since the flush that wrote the point: it
		// made all of this durable (a replica's idle partitions flush at each start).
		return nil
	}
	l.mu.RLock()
	segs := slices.Clone(l.segments)
	l.mu.RUnlock()
	for _, s := range segs {
		if l.fp.valid && s.base < l.fp.rp.base {
			// Sealed before the last flush, which synced it, and never written since:
			// a replica's partitions flush at each snapshot and at each start, and
			// syncing every old segment again would cost a sync per file each time.
			continue
		}
		f, err := s.file(l.fs, s.path)
		if err != nil {
			return fmt.Errorf("segment: flushing %s: %w", s.path, err)
		}
		if err := f.Sync(); err != nil {
			l.failErr = fmt.Errorf("%w: flush: %w", ErrFailed, err)
			return l.failErr
		}
	}
	// The files' entries, and the directory's own entry (a NoSync log made it without
	// a sync of its parent).
	for _, d := range []string{l.dir, filepath.Dir(l.dir)} {
		if err := l.fs.SyncDir(d); err != nil {
			l.failErr = fmt.Errorf("%w: flush: %w", ErrFailed, err)
			return l.failErr
		}
	}
	if l.opts.NoSync {
		// How far it is durable now: Open cuts a torn write only past it.
		if err := l.writeFlushPoint(); err != nil {
			return fmt.Errorf("segment: writing the flush point of %s: %w", l.dir, err)
		}
	}
	return nil
}
