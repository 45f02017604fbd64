package raftetcd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestALearnerAddedAgainWithAnEmptyLogCatchesUp: a move to node 3 adds it as a
// learner and it copies the log; the move is cancelled and node 3 deletes its copy
// (the Raft log with it); before the leader's own pass removes the learner, a move to
// node 3 starts again, and node 3 joins afresh, an empty log under the same raft id.
// The leader still holds the learner's old progress (etcd-io/raft never lowers it), so
// it sends appends from there (each refused) and heartbeats whose commit index is past
// the fresh log's end. The learner must catch up. On the old code raft's panic on such
// a heartbeat left the group's lock held (group.step had no deferred unlock), and the
// node's ticker and receive path hung behind it; had it not, the learner would never
// have caught up.
func TestALearnerAddedAgainWithAnEmptyLogCatchesUp(t *testing.T) {
	t.Parallel()
	learnerAddedAgain(t, 10)
}

// TestALearnerAddedAgainToAnIdleGroupCatchesUp is the test above without writes after
// the rejoin: a quiet partition. The leader sends the learner nothing but heartbeats,
// whose commit index is past its fresh log's end; the learner must still catch up. On
// the first version of the reset (started only by a refused append), the learner
// dropped every heartbeat without an answer and the leader, counting it caught up,
// never sent it anything: a move would have switched in an empty voter.
func TestALearnerAddedAgainToAnIdleGroupCatchesUp(t *testing.T) {
	t.Parallel()
	learnerAddedAgain(t, 0)
}

// learnerAddedAgain copies 50 entries to a learner, deletes its copy and adds it again
// under the same raft id, writes more entries (none: an idle group), and waits for the
// learner to hold everything.
func learnerAddedAgain(t *testing.T, more int) {
	const g = "moved"
	ns := startNodes(t, 3, 0, func(o *Options) { o.Store = StoreRaftstore; o.NoQuiesce = true }, func(int) {})
	var applied [3]atomic.Int64
	open := func(i int, cfg GroupConfig) {
		t.Helper()
		k := i
		cfg.Apply = func(uint64, []byte) any { applied[k].Add(1); return nil }
		if err := ns[i].host.OpenGroup(g, cfg); err != nil {
			t.Fatal(err)
		}
	}
	dir3 := filepath.Join(ns[2].opts.Dir, "part", "raft")
	open(0, GroupConfig{Voters: []uint64{1, 2}, Dir: filepath.Join(ns[0].opts.Dir, "part", "raft"), Campaign: true})
	open(1, GroupConfig{Voters: []uint64{1, 2}, Dir: filepath.Join(ns[1].opts.Dir, "part", "raft")})
	open(2, GroupConfig{Dir: dir3, Join: true})
	// Node 1 stands first, but either voter may win (node 2 stands when its election
	// timeout passes first, as on a loaded machine), or take over later: the test
	// works through whichever leads.
	leader := func() (*testNode, GroupInfo) {
		for _, n := range ns[:2] {
			if i, ok := n.host.Info(g); ok && i.Leader {
				return n, i
			}
		}
		return nil, GroupInfo{}
	}
	lead := func(what string) *testNode {
		t.Helper()
		var l *testNode
		deadline := time.Now().Add(30 * time.Second)
		for l, _ = leader(); l == nil; l, _ = leader() {
			if time.Now().After(deadline) {
				i1, _ := ns[0].host.Info(g)
				i2, _ := ns[1].host.Info(g)
				t.Fatalf("no leader after 30 s (%s): node 1 term %d knows leader %d, node 2 term %d knows leader %d", what, i1.Term, i1.Lead, i2.Term, i2.Lead)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return l
	}
	if err := lead("before the learner is added").host.ChangeConf(g, ConfChange{AddLearners: []uint64{3}}); err != nil {
		t.Fatal(err)
	}
	write := func(n int, tag string) {
		for k := range n {
			deadline := time.Now().Add(30 * time.Second)
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := lead("writing").host.Propose(ctx, g, []byte(fmt.Sprintf("%s entry %03d", tag, k)))
				cancel()
				if errors.Is(err, ErrNotLeader) && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
					continue // it lost the leadership since: ask the new leader
				}
				if err != nil {
					t.Fatal(err)
				}
				break
			}
		}
	}
	write(50, "first")
	poll(t, 30*time.Second, "the learner copied the log", func() bool {
		l, i := leader()
		return l != nil && i.Match[3] >= i.Commit && applied[2].Load() >= 50
	})
	// Cancelled: node 3 deletes its copy. Placed there again before the leader removed
	// the learner: it joins afresh, an empty log under the same raft id.
	ns[2].host.CloseGroup(g)
	if err := os.RemoveAll(filepath.Join(ns[2].opts.Dir, "part")); err != nil {
		t.Fatal(err)
	}
	applied[2].Store(0)
	open(2, GroupConfig{Dir: dir3, Join: true})
	write(more, "second")
	want := int64(50 + more)
	deadline := time.Now().Add(20 * time.Second)
	for applied[2].Load() < want {
		if time.Now().After(deadline) {
			locked := make(chan struct{})
			go func() { _, _ = ns[2].host.Info(g); close(locked) }()
			wedged := false
			select {
			case <-locked:
			case <-time.After(2 * time.Second):
				wedged = true
			}
			_, li := leader()
			t.Fatalf("the re-added learner applied %d of %d entries in 20 s (%d written after it rejoined; leader's Match for it %d, commit %d); its group's lock held for good: %v",
				applied[2].Load(), want, more, li.Match[3], li.Commit, wedged)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
