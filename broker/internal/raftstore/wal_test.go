package raftstore

import (
	"errors"
	"fmt"
	"math/rand"
	"sync/atomic"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// TestWALSavesSurviveAPowerLoss: a store whose appends and state writes go to a
// write-ahead file small enough to rotate (and be checkpointed in the background)
// every few saves, with segments of two entries and a cut of a divergent suffix
// every few saves, loses its unsynced bytes (torn at random) at the end of a run of
// n saves. After the replay the log is exactly what the last save left, and the hard
// state holds the last term and vote saved: nothing durable was lost, nothing cut came
// back. No segment or state file was ever synced by the store itself.
func TestWALSavesSurviveAPowerLoss(t *testing.T) {
	for _, n := range []int{1, 9, 60, 200} {
		m := vfs.NewMem()
		w, _, err := wal.Open("/wal", wal.Options{FS: m, Root: "/", FileBytes: 4 << 10})
		if err != nil {
			t.Fatal(err)
		}
		s := openOn(t, m, Options{SegmentBytes: 100, CacheEntries: -1, WAL: w})
		rng := rand.New(rand.NewSource(int64(n)))
		log := idx(0).terms(0)
		term := uint64(1)
		var hs raftpb.HardState
		for i := range n {
			last := log[len(log)-1].Index
			from := last + 1
			if i%7 == 6 && last > 3 {
				// A new leader overwrites a divergent tail of one to three entries.
				from = last - uint64(rng.Intn(3))
				term++
			}
			ents := withData(from, from+uint64(rng.Intn(3)), term)
			hs = raftpb.HardState{Term: term, Vote: uint64(i%3 + 1), Commit: min(from-1, 2)}
			if err := s.Save(hs, ents); err != nil {
				t.Fatalf("save %d: %v", i, err)
			}
			log = append(log[:from], ents...)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		m.CrashTorn(rand.New(rand.NewSource(int64(n) + 1)))
		_ = w.Close() // the process is gone; this only stops its goroutines
		if n >= 60 && w.Stats().Checkpoints == 0 {
			t.Fatalf("%d saves: no write-ahead file was checkpointed", n)
		}
		w2, rep, err := wal.Open("/wal", wal.Options{FS: m, Root: "/", FileBytes: 4 << 10})
		if err != nil {
			t.Fatalf("%d saves: replay: %v", n, err)
		}
		if rep.Records == 0 {
			t.Fatalf("%d saves: nothing replayed", n)
		}
		if err := w2.Close(); err != nil {
			t.Fatal(err)
		}
		s = openOn(t, m, Options{SegmentBytes: 100, CacheEntries: -1})
		if got := logOf(t, s); !sameLog(got, log) {
			t.Fatalf("%d saves: log after the power loss%s\nwant%s", n, describe(got), describe(log))
		}
		if got := s.HardState(); got.Term != hs.Term || got.Vote != hs.Vote {
			t.Fatalf("%d saves: hard state %+v, want term %d vote %d", n, got, hs.Term, hs.Vote)
		}
		if st := s.Stats(); st.TornBytes != 0 {
			t.Fatalf("%d saves: %d torn bytes cut: the replay left a segment incomplete", n, st.TornBytes)
		}
		_ = s.Close()
	}
}

// stubbornWAL passes commits and checkpoints to a real write-ahead file, counts
// them, and answers the commit numbered failAt with ErrNotWritten, recording nothing
// (as when the write-ahead file has no space for its next file).
type stubbornWAL struct {
	w           *wal.WAL
	commits     atomic.Int64
	checkpoints atomic.Int64
	failAt      atomic.Int64
}

func (c *stubbornWAL) Commit(spans []wal.Span) error {
	if c.commits.Add(1) == c.failAt.Load() {
		return fmt.Errorf("%w: %w", wal.ErrNotWritten, errors.New("no space for a new write-ahead file"))
	}
	return c.w.Commit(spans)
}

func (c *stubbornWAL) SyncOwn(what string, sync func() error) error {
	return c.w.SyncOwn(what, sync)
}

func (c *stubbornWAL) Checkpoint() error {
	c.checkpoints.Add(1)
	return c.w.Checkpoint()
}

// TestWALNotWrittenIsTakenBack: a save whose commit recorded nothing fails the store,
// and takes its bytes back out of the files. A store opened again by the same process
// (a group closed and reopened) must not take the unrecorded frames for its log, nor
// an unrecorded term and vote for its state: its next durable appends would follow
// bytes a power loss drops, and the log would not open after it.
func TestWALNotWrittenIsTakenBack(t *testing.T) {
	for _, what := range []string{"entries", "term", "first term"} {
		t.Run(what, func(t *testing.T) {
			m := vfs.NewMem()
			w, _, err := wal.Open("/wal", wal.Options{FS: m, Root: "/"})
			if err != nil {
				t.Fatal(err)
			}
			cw := &stubbornWAL{w: w}
			opts := Options{WAL: cw, CacheEntries: -1}
			s := openOn(t, m, opts)
			want, wantHS := idx(0).terms(0), raftpb.HardState{}
			if what != "first term" {
				if err := s.Save(raftpb.HardState{Term: 1, Vote: 1}, withData(1, 3, 1)); err != nil {
					t.Fatal(err)
				}
				want, wantHS = append(want, withData(1, 3, 1)...), raftpb.HardState{Term: 1, Vote: 1}
			}
			cw.failAt.Store(cw.commits.Load() + 1)
			if what == "entries" {
				err = s.Append(withData(4, 5, 1))
			} else {
				err = s.SetHardState(raftpb.HardState{Term: 2, Vote: 2})
			}
			if !errors.Is(err, wal.ErrNotWritten) {
				t.Fatalf("save over an unwritten commit: %v", err)
			}
			_ = s.Close()
			s = openOn(t, m, opts)
			if got := logOf(t, s); !sameLog(got, want) {
				t.Fatalf("reopened in the same process: log%s, want%s", describe(got), describe(want))
			}
			if hs := s.HardState(); hs.Term != wantHS.Term || hs.Vote != wantHS.Vote {
				t.Fatalf("reopened in the same process: hard state %+v, want term %d vote %d", hs, wantHS.Term, wantHS.Vote)
			}
			next := want[len(want)-1].Index + 1
			if err := s.Save(raftpb.HardState{Term: 3, Vote: 3}, withData(next, next+1, 3)); err != nil {
				t.Fatal(err)
			}
			want = append(want, withData(next, next+1, 3)...)
			_ = s.Close()
			m.Crash()
			_ = w.Close() // the power is gone; this stops its goroutines
			w2, _, err := wal.Open("/wal", wal.Options{FS: m, Root: "/"})
			if err != nil {
				t.Fatal(err)
			}
			_ = w2.Close()
			s = openOn(t, m, Options{CacheEntries: -1})
			defer s.Close()
			if got := logOf(t, s); !sameLog(got, want) {
				t.Fatalf("after the power loss: log%s, want%s", describe(got), describe(want))
			}
			if hs := s.HardState(); hs.Term != 3 || hs.Vote != 3 {
				t.Fatalf("after the power loss: hard state %+v, want term 3 vote 3", hs)
			}
		})
	}
}

// TestWALNewStoreDoesNotCheckpoint: opening a store in a new directory (a new replica)
// checkpoints nothing: it has nothing in the write-ahead file, and a checkpoint rotates
// the node's current file.
func TestWALNewStoreDoesNotCheckpoint(t *testing.T) {
	m := vfs.NewMem()
	w, _, err := wal.Open("/wal", wal.Options{FS: m, Root: "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cw := &stubbornWAL{w: w}
	s := openOn(t, m, Options{WAL: cw})
	defer s.Close()
	if err := s.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}); err != nil {
		t.Fatal(err)
	}
	if n := cw.checkpoints.Load(); n != 0 {
		t.Fatalf("a new store opened and given its first snapshot checkpointed the write-ahead file %d times", n)
	}
	if err := s.Append(withData(6, 7, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 9, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}); err != nil {
		t.Fatal(err)
	}
	if n := cw.checkpoints.Load(); n != 1 {
		t.Fatalf("a snapshot over appended entries checkpointed %d times, want 1", n)
	}
}

// TestOwnSyncFailureFailsTheWAL: a store closed with a commit-only hard state pending
// syncs its state file itself; when that sync fails it may be the only report of a
// lost write-back of a term and vote the write-ahead file holds, so the write-ahead
// file fails closed and keeps them (a checkpoint through a new handle would free
// them, and a restart could vote twice in a term).
func TestOwnSyncFailureFailsTheWAL(t *testing.T) {
	m := vfs.NewMem()
	w, _, err := wal.Open("/wal", wal.Options{FS: m, Root: "/"})
	if err != nil {
		t.Fatal(err)
	}
	s := openOn(t, m, Options{WAL: &stubbornWAL{w: w}, CacheEntries: -1})
	if err := s.Save(raftpb.HardState{Term: 1, Vote: 1}, withData(1, 3, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetHardState(raftpb.HardState{Term: 1, Vote: 1, Commit: 3}); err != nil {
		t.Fatal(err)
	}
	m.FailSync(1) // Close's sync of the state file
	if err := s.Close(); err == nil {
		t.Fatal("Close answered nil though its sync of the state file failed")
	}
	if err := w.Checkpoint(); !errors.Is(err, wal.ErrFailed) {
		t.Fatalf("a checkpoint after the store's own sync failed answered %v; want wal.ErrFailed (nothing freed)", err)
	}
	m.Crash()
	if _, rep, err := wal.Open("/wal", wal.Options{FS: m, Root: "/"}); err != nil || rep.Records == 0 {
		t.Fatalf("after a crash the write-ahead file replayed %+v, %v; want the term, vote and entries it held", rep, err)
	}
	s = openOn(t, m, Options{CacheEntries: -1})
	defer s.Close()
	if hs, _, err := s.InitialState(); err != nil || hs.Term != 1 || hs.Vote != 1 {
		t.Fatalf("after the replay the hard state is %+v, %v; want term 1, vote 1", hs, err)
	}
	if got := logOf(t, s); !sameLog(got, append(idx(0).terms(0), withData(1, 3, 1)...)) {
		t.Fatalf("after the replay the log is %v", got)
	}
}
