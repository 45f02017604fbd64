package meta

import (
	"errors"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
)

// TestHaltedNodeHandsTheControllerOver: a node whose state machine halted (here a
// member restarted with a binary that cannot speak the committed cluster version) can
// still win the controller: Raft knows nothing of the halt. Leading, it proposed every
// write sent to it, which committed and applied on the other nodes while the writer was
// answered ErrHalted (a create answered 503 that had created the topic), and it judged
// members and planned moves from a state that stopped at the halt. It must hand the
// controller over and refuse writes it cannot apply, so writes succeed through the
// others.
func TestHaltedNodeHandsTheControllerOver(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss, h := withAHaltedNode(t, net)
	// n3 wins the controller (as it may at any election).
	eventually(t, "n3 won the controller", func() error {
		if h.Leader() {
			return nil
		}
		l := leaderOf(ss[0], ss[1])
		if l == nil {
			return errors.New("no controller")
		}
		return l.raft.LeadershipTransferToServer(raft.ServerID(h.ServerID()), h.addr).Error()
	})
	w := ss[0]
	tp, err := w.CreateTopic(Topic{Name: "after-halt", TopicConfig: TopicConfig{Partitions: 1}})
	if err != nil {
		_, exists := w.Topic("after-halt")
		t.Fatalf("a write through n1 while the halted n3 led: %v (the topic exists on n1 all the same: %v)", err, exists)
	}
	if tp.Incarnation == 0 {
		t.Fatalf("created %+v", tp)
	}
	eventually(t, "the controller is a node that applies the log", func() error {
		if h.Leader() {
			return errors.New("the halted n3 leads")
		}
		if leaderOf(ss[0], ss[1]) == nil {
			return errors.New("no controller")
		}
		return nil
	})
}

// withAHaltedNode starts three nodes, waits for cluster version 2, then restarts n3
// with a binary that speaks only version 1: it halts at the commit of 2. It returns
// the nodes (n3 the restarted one) and n3.
func withAHaltedNode(t *testing.T, net *testNet) ([]*Store, *Store) {
	t.Helper()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	ss := startPeers(t, net, dirs)
	eventually(t, "version 2 committed on every node", func() error {
		for _, s := range ss {
			if v := s.ClusterVersion(); v < 2 {
				return fmt.Errorf("%s holds version %d", s.NodeID(), v)
			}
		}
		return nil
	})
	net.close(ss[2])
	h, err := net.open(dirs[2], "n3", "addr3", Cluster{VersionMax: 1})
	if err != nil {
		t.Fatal(err)
	}
	ss[2] = h
	eventually(t, "n3 halted", func() error {
		if h.fsm.haltedErr() == nil {
			return errors.New("not halted")
		}
		return nil
	})
	return ss, h
}
