package raftstore

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// Append stores ents durably: Save without a hard state.
func (s *Store) Append(ents []raftpb.Entry) error { return s.Save(raftpb.HardState{}, ents) }

// SetHardState stores hs: Save without entries.
func (s *Store) SetHardState(hs raftpb.HardState) error { return s.Save(hs, nil) }

// Save stores a Ready's entries and hard state and returns once raft may act on
// them: the entries, and a hard state whose term or vote changed, are durable. A
// hard state whose only change is the commit index is written but not synced (raft
// recovers the commit index from its peers; etcd-io/raft's MustSync says the same);
// Close syncs it.
//
// Entries whose first index is at or below the last stored index replace the
// stored suffix from there (a new leader overwriting this node's divergent,
// uncommitted tail). The cut is made durable before the new entries are written:
// the segments after the one holding the cut index are removed (last first, the
// directory synced after each), that segment is truncated and synced, and only then
// are the new entries written and synced. A crash at any point therefore leaves the
// old log, or a prefix of it, or the cut log with a prefix of the new entries; never
// new entries followed by old ones. Entries at or below the compaction point are
// ignored, as are leading entries identical (same index and term) to stored ones.
//
// Every sync goes through the node's SyncGroup when there is one; with a WAL, the
// entries and a durable hard state are each one commit to it instead. The entries
// are durable before the hard state is written, so an election's Ready (a new term
// or vote and entries) costs two rounds; the commit-only hard states of the steady
// state cost none.
func (s *Store) Save(hs raftpb.HardState, ents []raftpb.Entry) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	ents, cutAt, err := s.plan(ents)
	if err != nil {
		return err
	}
	if cutAt != 0 {
		if err := s.cut(cutAt); err != nil {
			return s.fail(err)
		}
	}
	if len(ents) > 0 {
		if err := s.write(ents); err != nil {
			return s.fail(err)
		}
	}
	// The state is written only once the entries are durable: its commit index may
	// cover them, and a commit index past the durable log would make the store
	// unopenable after a crash (raft refuses a commit beyond its last index). Even
	// an unsynced write could reach the disk before the entries did.
	hsChanged := !raft.IsEmptyHardState(hs) && hs != s.hs
	if hsChanged {
		st := s.state.cur
		st.term, st.vote, st.commit = hs.Term, hs.Vote, hs.Commit
		var err error
		if hs.Term != s.hs.Term || hs.Vote != s.hs.Vote {
			err = s.writeStateSync(st)
		} else {
			_, _, err = s.state.write(st)
		}
		if err != nil {
			return s.fail(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(ents) > 0 {
		for i := range ents {
			if r := s.runs[len(s.runs)-1]; ents[i].Term != r.term {
				s.runs = append(s.runs, termRun{index: ents[i].Index, term: ents[i].Term})
			}
		}
		s.cacheAppend(ents)
		s.last = ents[len(ents)-1].Index
	}
	if hsChanged {
		s.hs = hs
	}
	return nil
}

// plan checks ents against the log the way MemoryStorage.Append does and returns
// what to write and where the stored log must be cut first (0: nowhere). Only the
// writer calls it, so it reads the writer-owned fields without mu.
func (s *Store) plan(ents []raftpb.Entry) ([]raftpb.Entry, uint64, error) {
	if len(ents) == 0 {
		return nil, 0, nil
	}
	for i := range ents {
		if n := ents[i].Size(); n > s.opts.MaxEntryBytes {
			return nil, 0, fmt.Errorf("%w: entry %d is %d bytes, the limit %d", ErrEntryTooLarge, ents[i].Index, n, s.opts.MaxEntryBytes)
		}
		if i == 0 {
			continue
		}
		if ents[i].Index != ents[i-1].Index+1 {
			return nil, 0, fmt.Errorf("%w: index %d follows %d", ErrNotContiguous, ents[i].Index, ents[i-1].Index)
		}
		if ents[i].Term < ents[i-1].Term {
			return nil, 0, fmt.Errorf("%w: term %d at index %d follows term %d", ErrNotContiguous, ents[i].Term, ents[i].Index, ents[i-1].Term)
		}
	}
	if last := ents[len(ents)-1].Index; last < s.first {
		return nil, 0, nil // all compacted
	}
	if ents[0].Index < s.first {
		ents = ents[s.first-ents[0].Index:]
	}
	if ents[0].Index > s.last+1 {
		return nil, 0, fmt.Errorf("%w: first index %d, last stored %d", ErrNotContiguous, ents[0].Index, s.last)
	}
	end := ents[len(ents)-1].Index + 1
	for len(ents) > 0 && ents[0].Index <= s.last && termIn(s.runs, ents[0].Index) == ents[0].Term {
		ents = ents[1:]
	}
	next := end
	if len(ents) > 0 {
		next = ents[0].Index
		if prev := termIn(s.runs, next-1); ents[0].Term < prev {
			return nil, 0, fmt.Errorf("%w: term %d at index %d follows stored term %d", ErrNotContiguous, ents[0].Term, next, prev)
		}
	}
	if next <= s.last {
		return ents, next, nil
	}
	return ents, 0, nil
}

// cut removes the stored entries from index i on, durably.
func (s *Store) cut(i uint64) error {
	if err := s.forgetWAL(); err != nil {
		return err
	}
	k := len(s.files) - 1
	for k > 0 && s.files[k].base > i {
		k--
	}
	seg := s.files[k]
	s.mu.Lock()
	gone := s.files[k+1:]
	s.files = s.files[: k+1 : k+1]
	s.stats.Cuts++
	s.stats.CutEntries += s.last - i + 1
	s.cacheCut(i)
	n := int(i - seg.base)
	size := int64(seg.size)
	if n < len(seg.pos) {
		size = int64(seg.pos[n])
	}
	seg.pos = seg.pos[:n:n]
	seg.size = size
	s.last = i - 1
	r := len(s.runs)
	for r > 1 && s.runs[r-1].index >= i {
		r--
	}
	s.runs = s.runs[:r:r]
	s.mu.Unlock()
	if err := s.removeSegments(gone, true); err != nil {
		return err
	}
	if err := seg.f.Truncate(size); err != nil {
		return err
	}
	// The cut must be durable before anything is written over it: otherwise a crash
	// could keep new frames and, past them, old frames the truncate had removed.
	return s.sync(seg.f)
}

// write appends ents' frames to the active segment and makes them durable, rolling
// to a new segment when one would pass SegmentBytes. A segment is created only after
// the one before it is durable, so only the last segment can ever hold a torn write.
// Nothing becomes visible to readers here.
func (s *Store) write(ents []raftpb.Entry) error {
	seg := s.files[len(s.files)-1]
	s.buf = s.buf[:0]
	if size := entriesSize(ents); cap(s.buf) < size && size > keptWriteBuffer {
		if b, ok := writeBuffers.Get().(*[]byte); ok {
			s.buf = *b
		}
	}
	var pos []uint32
	// flush writes the frames gathered for seg and makes them durable.
	flush := func() error {
		if len(s.buf) == 0 {
			return nil
		}
		off := seg.size
		if _, err := seg.f.WriteAt(s.buf, off); err != nil {
			return err
		}
		if s.opts.WAL != nil {
			s.walSegs = true // before the commit: its outcome may be unknown
		}
		if err := s.durable(seg.f, seg.path, off, s.buf); err != nil {
			if errors.Is(err, wal.ErrNotWritten) {
				// Nothing of it was recorded: take the frames back out of the file,
				// so that a store opened again by this process does not take them
				// for its log and append durable entries behind bytes a power loss
				// would drop. (Best effort: the store fails closed either way.)
				_ = seg.f.Truncate(off)
			}
			return err
		}
		s.mu.Lock()
		seg.pos = append(seg.pos, pos...)
		seg.size += int64(len(s.buf))
		s.mu.Unlock()
		s.buf, pos = s.buf[:0], pos[:0]
		return nil
	}
	for i := range ents {
		frame := int64(headerBytes + ents[i].Size())
		if (len(seg.pos) > 0 || len(pos) > 0) && seg.size+int64(len(s.buf))+frame > s.opts.SegmentBytes {
			if err := flush(); err != nil {
				return err
			}
			next, err := s.createSegment(ents[i].Index)
			if err != nil {
				return err
			}
			s.mu.Lock()
			s.files = append(s.files, next)
			s.mu.Unlock()
			seg = next
		}
		at := seg.size + int64(len(s.buf))
		if at > math.MaxUint32 {
			return fmt.Errorf("raftstore: %s would pass 4 GiB", seg.path)
		}
		pos = append(pos, uint32(at))
		s.buf = appendFrame(s.buf, &ents[i])
	}
	err := flush()
	if cap(s.buf) > keptWriteBuffer {
		// A large write's buffer is not kept for the next: every group of the node
		// would hold its largest write's size in memory for as long as it lives.
		// Nothing holds it now (the write-ahead file keeps no span's data).
		b := s.buf[:0]
		writeBuffers.Put(&b)
		s.buf = nil
	}
	return err
}

// keptWriteBuffer is the largest write buffer a store keeps for its next write; a
// larger one goes to writeBuffers, which every store of the process shares and the
// garbage collector empties when it goes unused.
const keptWriteBuffer = 64 << 10

var writeBuffers sync.Pool // of *[]byte, each larger than keptWriteBuffer

func (s *Store) usable() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case s.closed:
		return ErrClosed
	case s.failed != nil:
		return fmt.Errorf("%w: %w", ErrFailed, s.failed)
	}
	return nil
}

// fail marks the store failed closed: after a failed write or sync nothing written
// since the last good sync can be trusted, and retrying a sync proves nothing.
func (s *Store) fail(err error) error {
	s.mu.Lock()
	if s.failed == nil {
		s.failed = err
	}
	s.mu.Unlock()
	return fmt.Errorf("%w: %w", ErrFailed, err)
}

// entriesSize is the size of ents' frames.
func entriesSize(ents []raftpb.Entry) int {
	n := 0
	for i := range ents {
		n += headerBytes + ents[i].Size()
	}
	return n
}
