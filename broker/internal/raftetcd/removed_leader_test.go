package raftetcd

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestARemovedLeaderConfirmsNothing: a leader whose own removal committed under its
// leadership leads on in etcd-io/raft (until it hands over), and raft answers its read
// index without a round when the configuration left has a single voter, another node,
// which may well lead by now. ConfirmLeader must not vouch for it: on the old code it
// answered nil at once, so such a leader (cut off from the rest) passed the checks
// that ConfirmLeader guards.
func TestARemovedLeaderConfirmsNothing(t *testing.T) {
	t.Parallel()
	ns := startCluster(t, 1)
	g := groupName(0)
	L := leaders(t, ns, 1)[g]
	var others []uint64
	for _, n := range ns {
		if n != L {
			others = append(others, n.id)
		}
	}
	voters := func() []uint64 {
		info, _ := L.host.Info(g)
		return info.Voters
	}
	if err := L.host.ChangeConf(g, ConfChange{RemoveVoters: []uint64{others[1]}}); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "the leader applied the removal of a follower", func() bool {
		return !slices.Contains(voters(), others[1])
	})
	if err := L.host.ChangeConf(g, ConfChange{RemoveVoters: []uint64{L.id}}); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "the leader applied its own removal", func() bool {
		return slices.Equal(voters(), []uint64{others[0]})
	})
	if info, _ := L.host.Info(g); !info.Leader {
		t.Fatalf("precondition: the removed leader no longer leads: %+v", info)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := L.host.ConfirmLeader(ctx, g); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("ConfirmLeader of a leader its configuration no longer counts: %v, want ErrNotLeader", err)
	}
}
