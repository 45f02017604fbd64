package raftstore

import (
	"bytes"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Compact drops the entries up to and including i from the log: FirstIndex becomes
// i+1 and Term(i) stays answerable. The compaction point is made durable in the
// state file first; then every segment whose entries are all at or below i is
// removed, oldest first with a directory sync after each, never the active segment
// and never a segment holding an entry above i. The caller compacts only what its
// state machine has made durable elsewhere (for a partition: log/ up to i).
func (s *Store) Compact(i uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	switch {
	case i < s.first:
		return raft.ErrCompacted
	case i > s.last:
		return ErrOutOfRange
	}
	t := termIn(s.runs, i)
	st := s.state.cur
	st.compactIndex, st.compactTerm = i, t
	if err := s.writeStateSync(st); err != nil {
		return s.fail(err)
	}
	s.mu.Lock()
	s.first, s.firstTerm = i+1, t
	s.runs = trimRuns(s.runs, i, t)
	s.cacheDropBelow(i + 1)
	s.mu.Unlock()
	if err := s.dropCompacted(); err != nil {
		return s.fail(err)
	}
	return nil
}

// ApplySnapshot installs a snapshot received from the leader: the log is replaced
// by an empty one after the snapshot's index. In order, each step durable before the
// next: the snapshot file; the compaction point (the snapshot's index and term) in
// the state file; the removal of every segment, last first; an empty segment after
// the snapshot. Open finishes an install a crash interrupted. A snapshot not newer
// than the stored one fails with raft.ErrSnapOutOfDate.
func (s *Store) ApplySnapshot(snap raftpb.Snapshot) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if snap.Metadata.Index <= s.snap.Metadata.Index {
		return raft.ErrSnapOutOfDate
	}
	snap.Data = bytes.Clone(snap.Data)
	// Every segment goes below, and the new one may take a removed one's name.
	if err := s.forgetWAL(); err != nil {
		return s.fail(err)
	}
	if err := writeSnapshot(s.fs, s.dir, &snap, s.sync); err != nil {
		return s.fail(err)
	}
	idx, term := snap.Metadata.Index, snap.Metadata.Term
	st := s.state.cur
	// A snapshot holds committed entries only, and the commit index that follows it
	// in the same Ready is written but not synced: a power loss in between must not
	// leave a durable commit index below the log's new start.
	st.commit = max(s.hs.Commit, idx)
	st.compactIndex, st.compactTerm = idx, term
	if err := s.writeStateSync(st); err != nil {
		return s.fail(err)
	}
	s.mu.Lock()
	s.hs.Commit = st.commit
	gone := s.files
	s.files = nil
	s.snap = snap
	s.first, s.firstTerm, s.last = idx+1, term, idx
	s.runs = []termRun{{index: idx, term: term}}
	s.cache, s.cacheSize = nil, 0
	s.mu.Unlock()
	if err := s.removeSegments(gone, true); err != nil {
		return s.fail(err)
	}
	seg, err := s.createSegment(idx + 1)
	if err != nil {
		return s.fail(err)
	}
	s.mu.Lock()
	s.files = []*segFile{seg}
	s.mu.Unlock()
	return nil
}

// CreateSnapshot records a snapshot of the state machine at index i (at most the
// last stored index, above the stored snapshot's): its index and term, cs (or the
// stored ConfState when nil) and data, the caller's small state. Entries are kept;
// Compact drops them once the state machine's own log is durable up to i.
func (s *Store) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (raftpb.Snapshot, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usable(); err != nil {
		return raftpb.Snapshot{}, err
	}
	switch {
	case i <= s.snap.Metadata.Index:
		return raftpb.Snapshot{}, raft.ErrSnapOutOfDate
	case i > s.last:
		return raftpb.Snapshot{}, ErrOutOfRange
	case i < s.first-1:
		return raftpb.Snapshot{}, raft.ErrCompacted
	}
	snap := raftpb.Snapshot{Data: bytes.Clone(data), Metadata: raftpb.SnapshotMetadata{
		Index: i, Term: termIn(s.runs, i), ConfState: s.snap.Metadata.ConfState}}
	if cs != nil {
		snap.Metadata.ConfState = *cs
	}
	if err := writeSnapshot(s.fs, s.dir, &snap, s.sync); err != nil {
		return raftpb.Snapshot{}, s.fail(err)
	}
	s.mu.Lock()
	s.snap = snap
	s.mu.Unlock()
	return snap, nil
}
