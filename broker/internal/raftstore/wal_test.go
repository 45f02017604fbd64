package raftstore

import (
	"math/rand"
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
