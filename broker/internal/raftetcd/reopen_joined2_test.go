package raftetcd

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// TestAJoinedReplicaReopenedBeforeItsLeaderSpokeJoinsAgain: a replica added to a group
// (opened with Join, an empty log) whose node restarts before the leader reaches it
// has no hard state and no entry. Opened again without Join (the broker asks to join
// only for a new directory), it took the group for new and bootstrapped a history of
// its own, its voters committed at indices 1 to 3, conflicting with the group's: the
// leader could never catch it up. It joins again now, and catches up once added. Found
// by an adversarial review (5 December); fails on the old code.
func TestAJoinedReplicaReopenedBeforeItsLeaderSpokeJoinsAgain(t *testing.T) {
	t.Parallel()
	const g = "moved"
	ns := startNodes(t, 3, 0, func(o *Options) { o.NoQuiesce = true; o.Store = StoreRaftstore }, func(int) {})
	for _, n := range ns[:2] {
		if err := n.host.OpenGroup(g, GroupConfig{Voters: []uint64{1, 2}, Dir: filepath.Join(n.opts.Dir, g), Campaign: n.id == 1}); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, 30*time.Second, "n1 leads", func() bool { i, _ := ns[0].host.Info(g); return i.Leader })
	for i := range 3 {
		poll(t, 30*time.Second, "a write", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := ns[0].host.Propose(ctx, g, []byte(fmt.Sprintf("v%d", i)))
			return err == nil
		})
	}
	// n3 joins (a move adds it), and its node restarts before the leader speaks to it.
	dir3 := filepath.Join(ns[2].opts.Dir, g)
	if err := ns[2].host.OpenGroup(g, GroupConfig{Join: true, Dir: dir3}); err != nil {
		t.Fatal(err)
	}
	ns[2].host.CloseGroup(g)
	if err := ns[2].host.OpenGroup(g, GroupConfig{Voters: []uint64{1, 2, 3}, Dir: dir3}); err != nil {
		t.Fatal(err)
	}
	// A bootstrap would be written by the group's first Ready, at once.
	time.Sleep(500 * time.Millisecond)
	gr := ns[2].host.group(g)
	gr.mu.Lock()
	last, _ := gr.st.LastIndex()
	gr.mu.Unlock()
	if last > 0 {
		t.Fatalf("a replica that had joined bootstrapped a history of its own when opened again (last index %d)", last)
	}
	// Added, it catches up with the group's log.
	poll(t, 30*time.Second, "the leader adds n3", func() bool { return ns[0].host.ChangeVoters(g, nil, []uint64{3}) == nil })
	poll(t, 30*time.Second, "n3 catches up", func() bool {
		i1, _ := ns[0].host.Info(g)
		i3, _ := ns[2].host.Info(g)
		return i3.Applied > 0 && i3.Applied == i1.Commit
	})
}
