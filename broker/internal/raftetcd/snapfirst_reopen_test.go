package raftetcd

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestSnapshotFirstSurvivesAReopenBeforeIt: a group made over data the application
// held (SnapshotFirst: a replication factor raised from 1, a forced takeover) must take
// its first snapshot before any member is added, or that member replays a log that does
// not hold the data. A node that stops after the group's first entries were written but
// before that snapshot (a crash; here its snapshot fails until the close) opens the
// group again, not created: it must still take that snapshot first, and say so
// (SnapshotPending) until it did. On the old code the reopened group reported nothing
// pending and never took it, so a learner added next got the bare log.
func TestSnapshotFirstSurvivesAReopenBeforeIt(t *testing.T) {
	t.Parallel()
	h, dir, _ := soleHostWith(t, func(*Options) {})
	app := &snapApp{}
	app.apps = map[uint64]*snapApp{1: app}
	var refuse atomic.Bool
	refuse.Store(true)
	snapshot := func() ([]byte, error) {
		if refuse.Load() {
			return nil, errors.New("the node stops before its first snapshot")
		}
		return app.snapshot()
	}
	for _, firstTerm := range []uint64{0, 700} { // Bootstrap's path, and the seeded one
		raftDir := filepath.Join(dir, "part", "raft-"+string(rune('a'+firstTerm%26)))
		g := "g" + raftDir
		refuse.Store(true)
		cfg := GroupConfig{Voters: []uint64{1}, Dir: raftDir, Campaign: true, SnapshotFirst: true, FirstTerm: func() (uint64, error) { return firstTerm, nil },
			Apply: app.apply, Snapshot: snapshot, Restore: app.restore}
		if err := h.OpenGroup(g, cfg); err != nil {
			t.Fatal(err)
		}
		poll(t, 20*time.Second, "the new group to lead and apply its first entries", func() bool {
			info, _ := h.Info(g)
			return info.Leader && info.Applied > 0
		})
		if info, _ := h.Info(g); !info.SnapshotPending || info.SnapshotIndex != 0 {
			t.Fatalf("first term %d: before its first snapshot: %+v; want it pending, none taken", firstTerm, info)
		}
		h.CloseGroup(g)
		// Opened again by the same configuration, its first snapshot still owed.
		refuse.Store(false)
		if err := h.OpenGroup(g, cfg); err != nil {
			t.Fatal(err)
		}
		info, _ := h.Info(g)
		if !info.SnapshotPending && info.SnapshotIndex == 0 {
			t.Fatalf("first term %d: reopened before its first snapshot, the group owes none: %+v (a learner added now replays a log without the data)", firstTerm, info)
		}
		poll(t, 20*time.Second, "the reopened group to take its first snapshot", func() bool {
			info, _ := h.Info(g)
			return !info.SnapshotPending && info.SnapshotIndex > 0
		})
		h.CloseGroup(g)
	}
}
