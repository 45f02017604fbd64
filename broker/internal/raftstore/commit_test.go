package raftstore

import (
	"os"

	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// TestCommitIndexSurvivesWhatWritesTheState: a commit-only change, written but not
// synced, becomes durable with Close or with the next synced write of the state
// file (a vote); a snapshot install makes a commit index of at least its own index
// durable, so a power loss before the next sync cannot leave the commit index below
// the log's start; and a stored commit index below the compaction point (what an
// earlier version left after such a power loss) is raised to it on Open. Raft
// refuses to start a node whose commit index is below its log's start.
func TestCommitIndexSurvivesWhatWritesTheState(t *testing.T) {
	t.Run("close", func(t *testing.T) {
		s, mem := newWith(t, append(idx(0).terms(0), withData(1, 10, 1)...), Options{})
		if err := s.SetHardState(raftpb.HardState{Term: 1, Vote: 1, Commit: 7}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		mem.Crash() // Close synced what was written
		if hs := openOn(t, mem, Options{}).HardState(); hs.Commit != 7 {
			t.Errorf("after Close and a power loss: %+v, want commit 7", hs)
		}
	})
	t.Run("vote", func(t *testing.T) {
		s, mem := newWith(t, append(idx(0).terms(0), withData(1, 10, 1)...), Options{})
		if err := s.SetHardState(raftpb.HardState{Term: 1, Vote: 1, Commit: 7}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetHardState(raftpb.HardState{Term: 2, Vote: 3, Commit: 8}); err != nil {
			t.Fatal(err)
		}
		mem.Crash()
		if hs := openOn(t, mem, Options{}).HardState(); hs != (raftpb.HardState{Term: 2, Vote: 3, Commit: 8}) {
			t.Errorf("after a vote and a power loss: %+v", hs)
		}
	})
	t.Run("snapshot", func(t *testing.T) {
		s, mem := newWith(t, append(idx(0).terms(0), withData(1, 12, 1)...), Options{})
		if err := s.SetHardState(raftpb.HardState{Term: 1, Vote: 1, Commit: 4}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openOn(t, mem, Options{})
		snap := raftpb.Snapshot{Data: []byte("s"), Metadata: raftpb.SnapshotMetadata{Index: 20, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}
		if err := s.ApplySnapshot(snap); err != nil {
			t.Fatal(err)
		}
		// The Ready that carried the snapshot also carries its commit index, in the
		// same term: a commit-only change, not synced.
		if err := s.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 20}, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Append(withData(21, 25, 1)); err != nil {
			t.Fatal(err)
		}
		if err := s.SetHardState(raftpb.HardState{Term: 1, Vote: 1, Commit: 23}); err != nil {
			t.Fatal(err)
		}
		mem.Crash()
		s = openOn(t, mem, Options{})
		hs, _, _ := s.InitialState()
		if hs.Commit < 20 || hs.Commit > 23 {
			t.Fatalf("after a snapshot, appends and a power loss: %+v, want a commit index in [20, 23]", hs)
		}
		startRaft(t, s)
	})
	t.Run("stored below the compaction point", func(t *testing.T) {
		// What a power loss left before this version: the install synced the
		// compaction point with the commit index of before it, and the commit-only
		// write that followed was lost.
		s, mem := newWith(t, append(idx(0).terms(0), withData(1, 12, 1)...), Options{})
		if err := s.SetHardState(raftpb.HardState{Term: 1, Vote: 1, Commit: 4}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		st, err := readState(mustOpenState(t, mem), "state")
		if err != nil {
			t.Fatal(err)
		}
		cur := st.cur
		cur.compactIndex, cur.compactTerm = 12, 1
		if _, _, err := st.write(cur); err != nil {
			t.Fatal(err)
		}
		s = openOn(t, mem, Options{})
		if hs, _, _ := s.InitialState(); hs.Commit != 12 {
			t.Fatalf("a stored commit index of 4 below the compaction point 12 opened as %+v, want 12", hs)
		}
		startRaft(t, s)
	})
}

// TestCommitIndexCoversTheSnapshot: a group may snapshot entries it applied before
// the write carrying their commit index was made (the asynchronous Ready loop applies
// while its worker writes), so the durable commit index can be below the snapshot's.
// Open raises it: the node starts raft with the snapshot's index as applied, which
// raft refuses above the commit index.
func TestCommitIndexCoversTheSnapshot(t *testing.T) {
	s, mem := newWith(t, append(idx(0).terms(0), withData(1, 20, 1)...), Options{})
	if err := s.SetHardState(raftpb.HardState{Term: 1, Vote: 1, Commit: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSnapshot(14, &raftpb.ConfState{Voters: []uint64{1}}, []byte("s")); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(8); err != nil {
		t.Fatal(err)
	}
	mem.Crash()
	s = openOn(t, mem, Options{})
	hs, _, _ := s.InitialState()
	snap, _ := s.Snapshot()
	if hs.Commit < snap.Metadata.Index {
		t.Fatalf("after a power loss: commit index %d below the snapshot's %d", hs.Commit, snap.Metadata.Index)
	}
	startRaftAt(t, s, snap.Metadata.Index)
}

// mustOpenState opens the state file of the store at testDir for writing.
func mustOpenState(t *testing.T, mem *vfs.Mem) vfs.File {
	t.Helper()
	f, err := mem.OpenFile(testDir+"/"+stateName, os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// startRaft starts a raft node on s, as a restarted node does: it fails if raft
// refuses the stored state.
func startRaft(t *testing.T, s *Store) { t.Helper(); startRaftAt(t, s, 0) }

// startRaftAt is startRaft with the applied index the node starts from.
func startRaftAt(t *testing.T, s *Store, applied uint64) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("raft refused the reopened store: %v", r)
		}
	}()
	if _, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: s, Applied: applied, MaxInflightMsgs: 16, Logger: quietLogger}); err != nil {
		t.Fatal(err)
	}
}
