package raftetcd

import (
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestReopenWithAppliedKeepsConfChangesAfterTheSnapshot: a group opened again with
// GroupConfig.Applied past its snapshot does not hand the entries up to Applied to
// raft again, so raft never re-applies a configuration change among them; its
// configuration must still include that change (not be the older snapshot's).
func TestReopenWithAppliedKeepsConfChangesAfterTheSnapshot(t *testing.T) {
	const g = "applied"
	ns := startNodes(t, 1, 0, func(o *Options) {
		o.Store, o.SnapshotEvery, o.SnapshotKeep, o.NoQuiesce = StoreRaftstore, 4, 1000, true
	}, func(int) {})
	n := ns[0]
	cfg := GroupConfig{Voters: []uint64{1}, Dir: filepath.Join(n.opts.Dir, g), Campaign: true,
		Snapshot: func() ([]byte, error) { return []byte("s"), nil }}
	if err := n.host.OpenGroup(g, cfg); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "a leader", func() bool { i, _ := n.host.Info(g); return i.Leader })
	poll(t, 10*time.Second, "a snapshot", func() bool {
		propose(t, n, g)
		i, _ := n.host.Info(g)
		return i.SnapshotIndex > 0
	})
	if err := n.host.ChangeConf(g, ConfChange{AddLearners: []uint64{2}}); err != nil {
		t.Fatal(err)
	}
	var applied uint64
	poll(t, 10*time.Second, "the learner added and applied", func() bool {
		i, _ := n.host.Info(g)
		applied = i.Applied
		return slices.Contains(i.Learners, 2) && i.Applied == i.Commit
	})
	i, _ := n.host.Info(g)
	if i.SnapshotIndex >= applied {
		t.Skipf("snapshot %d already covers the change (applied %d)", i.SnapshotIndex, applied)
	}
	n.host.CloseGroup(g)
	cfg.Applied = applied
	if err := n.host.OpenGroup(g, cfg); err != nil {
		t.Fatal(err)
	}
	poll(t, 5*time.Second, "the reopened group's applied index back where it was", func() bool {
		i, _ := n.host.Info(g)
		return i.Applied >= applied
	})
	gr := n.host.group(g)
	gr.mu.Lock()
	st := gr.rn.Status()
	gr.mu.Unlock()
	i, _ = n.host.Info(g)
	if !slices.Contains(i.Learners, 2) || !hasLearner(st.Config.Learners, 2) {
		t.Fatalf("reopened with Applied %d (snapshot %d): learners %v, raft's configuration %v; the learner added at or below Applied is lost", applied, i.SnapshotIndex, i.Learners, st.Config)
	}
}

func hasLearner(m map[uint64]struct{}, id uint64) bool { _, ok := m[id]; return ok }
