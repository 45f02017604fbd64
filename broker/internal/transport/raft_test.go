package transport

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// listFSM records the commands it applied.
type listFSM struct {
	mu  sync.Mutex
	log []string
}

func (f *listFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, string(l.Data))
	return len(f.log)
}

func (f *listFSM) applied() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

func (f *listFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, fmt.Errorf("not needed") }
func (f *listFSM) Restore(io.ReadCloser) error         { return fmt.Errorf("not needed") }

type raftNode struct {
	tn    *testNode
	raft  *raft.Raft
	fsm   *listFSM
	trans *raft.NetworkTransport
}

func TestRaftClusterOverTheStreamLayer(t *testing.T) {
	const n = 3
	var nodes []*raftNode
	var servers []raft.Server
	for i := range n {
		tn := mustStartNode(t, fmt.Sprintf("r%d", i), nil)
		nodes = append(nodes, &raftNode{tn: tn, fsm: &listFSM{}})
		servers = append(servers, raft.Server{ID: raft.ServerID(tn.NodeID()), Address: raft.ServerAddress(tn.Addr())})
	}
	for _, rn := range nodes {
		cfg := raft.DefaultConfig()
		cfg.LocalID = raft.ServerID(rn.tn.NodeID())
		cfg.HeartbeatTimeout = 500 * time.Millisecond
		cfg.ElectionTimeout = 500 * time.Millisecond
		cfg.LeaderLeaseTimeout = 250 * time.Millisecond
		cfg.CommitTimeout = 50 * time.Millisecond
		cfg.Logger = hclog.NewNullLogger()
		rn.trans = raft.NewNetworkTransport(rn.tn.StreamLayer(), 3, 5*time.Second, io.Discard)
		store := raft.NewInmemStore()
		snaps := raft.NewInmemSnapshotStore()
		if err := raft.BootstrapCluster(cfg, store, store, snaps, rn.trans, raft.Configuration{Servers: servers}); err != nil {
			t.Fatal(err)
		}
		r, err := raft.NewRaft(cfg, rn.fsm, store, store, snaps, rn.trans)
		if err != nil {
			t.Fatal(err)
		}
		rn.raft = r
		trans := rn.trans
		t.Cleanup(func() {
			trans.Close()
			r.Shutdown().Error()
		})
	}

	start := time.Now()
	leader := waitLeader(t, nodes, nil)
	t.Logf("leader after %v", time.Since(start))
	for i := range 10 {
		if err := leader.raft.Apply(fmt.Appendf(nil, "cmd %d", i), 10*time.Second).Error(); err != nil {
			t.Fatalf("apply on %s: %v", leader.tn.NodeID(), err)
		}
	}
	waitApplied(t, nodes, 10)

	// The leader's node plane goes away: the others elect a new leader over theirs.
	leader.tn.Close()
	var rest []*raftNode
	for _, rn := range nodes {
		if rn != leader {
			rest = append(rest, rn)
		}
	}
	next := waitLeader(t, rest, leader)
	t.Logf("new leader after %v", time.Since(start))
	for i := 10; i < 15; i++ {
		if err := next.raft.Apply(fmt.Appendf(nil, "cmd %d", i), 10*time.Second).Error(); err != nil {
			t.Fatalf("apply on the new leader %s: %v", next.tn.NodeID(), err)
		}
	}
	waitApplied(t, rest, 15)
	t.Logf("done after %v", time.Since(start))
}

// waitLeader waits until one of nodes leads, and every one of them agrees on it.
func waitLeader(t *testing.T, nodes []*raftNode, not *raftNode) *raftNode {
	t.Helper()
	var leader *raftNode
	waitFor(t, "a leader", 90*time.Second, func() bool {
		leader = nil
		for _, rn := range nodes {
			if rn.raft.State() == raft.Leader && rn != not {
				leader = rn
			}
		}
		if leader == nil {
			return false
		}
		for _, rn := range nodes {
			if addr, _ := rn.raft.LeaderWithID(); string(addr) != leader.tn.Addr() {
				return false
			}
		}
		return true
	})
	return leader
}

func waitApplied(t *testing.T, nodes []*raftNode, count int) {
	t.Helper()
	want := make([]string, count)
	for i := range want {
		want[i] = fmt.Sprintf("cmd %d", i)
	}
	for _, rn := range nodes {
		waitFor(t, rn.tn.NodeID()+" to apply every command", 60*time.Second, func() bool {
			return slices.Equal(rn.fsm.applied(), want)
		})
	}
}
