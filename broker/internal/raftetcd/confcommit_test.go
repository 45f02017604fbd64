package raftetcd

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestFollowersLearnACommittedMembershipChangeAtOnce: with lazy heartbeats, the append
// that only tells the followers of a new commit index waits for the next frame to
// them, at the latest the next tick. For a membership change that wait matters: a
// follower that has not learned that the entry leaving a joint configuration
// committed still needs a majority of the old voters to elect a leader, and with an
// old voter gone for good (a wiped replica being replaced), the leader's death in that
// window leaves no survivor able to lead until it is back. `make test` met it once
// (e2e TestReplicationFollowerWiped, the leader killed 50 ms after the change). A
// committed change now goes out at once. Here the clocks stop before the change, so
// on the old code the followers never learn it.
func TestFollowersLearnACommittedMembershipChangeAtOnce(t *testing.T) {
	t.Parallel()
	for _, broker := range []bool{false, true} {
		t.Run(fmt.Sprintf("broker=%v", broker), func(t *testing.T) {
			const g = "conf"
			ns := startNodes(t, 3, 0, func(o *Options) {
				o.LazyHeartbeats, o.NoQuiesce = true, true
				if broker {
					o.Store, o.AsyncStorageWrites, o.ParallelAppend = StoreRaftstore, true, true
				}
			}, func(int) {})
			for _, n := range ns {
				if err := n.host.OpenGroup(g, GroupConfig{Voters: []uint64{1, 2, 3}, Dir: filepath.Join(n.opts.Dir, g), Campaign: n.id == 1}); err != nil {
					t.Fatal(err)
				}
			}
			poll(t, 30*time.Second, "a leader, and every replica caught up", func() bool {
				l := leaderIn(ns, g)
				if l == nil {
					return false
				}
				li, _ := l.host.Info(g)
				for _, n := range ns {
					if i, _ := n.host.Info(g); i.Applied != li.Commit {
						return false
					}
				}
				return true
			})
			// The clocks stop: from here on nothing goes out with a tick.
			for _, n := range ns {
				n.host.clockStopped.Store(true)
			}
			lead := leaderIn(ns, g)
			var gone *testNode
			for _, n := range ns {
				if n != lead {
					gone = n
				}
			}
			// A follower is replaced by n4 (a wiped replica's new id, its node not back
			// yet): a joint change and the entry that leaves it, both committed by the
			// other two.
			if err := lead.host.ChangeConf(g, ConfChange{RemoveVoters: []uint64{gone.id}, AddVoters: []uint64{4}}); err != nil {
				t.Fatal(err)
			}
			var want []uint64
			for _, n := range ns {
				if n != gone {
					want = append(want, n.id)
				}
			}
			want = append(want, 4)
			for _, n := range ns {
				if n == gone {
					continue
				}
				poll(t, 10*time.Second, fmt.Sprintf("n%d out of the joint configuration, voters %v", n.id, want), func() bool {
					i, _ := n.host.Info(g)
					v := slices.Clone(i.Voters)
					slices.Sort(v)
					return !i.Joint && slices.Equal(v, want)
				})
			}
		})
	}
}

// leaderIn is the node of ns that leads group g, or nil.
func leaderIn(ns []*testNode, g string) *testNode {
	for _, n := range ns {
		if i, _ := n.host.Info(g); i.Leader {
			return n
		}
	}
	return nil
}
