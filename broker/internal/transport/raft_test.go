package transport

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/testutil"
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
	nodes := startRaftCluster(t, 3, nil)
	start := time.Now()
	leader := waitLeader(t, nodes, nil)
	t.Logf("leader after %v", time.Since(start))
	applyCmds(t, leader, 0, 10)
	waitApplied(t, nodes, 10)

	// The leader's node plane goes away: the others elect a new leader over theirs.
	leader.tn.Close()
	rest := others(nodes, leader)
	next := waitLeader(t, rest, leader)
	t.Logf("new leader after %v", time.Since(start))
	applyCmds(t, next, 10, 15)
	waitApplied(t, rest, 15)
	t.Logf("done after %v", time.Since(start))
}

// A node plane that shuts down ends raft's streams as a clean end of stream, on its
// own side and on its peers': raft's transport logs any other read error as "failed
// to decode incoming command", which every orderly stop and rolling restart would
// print as an error.
func TestANodePlaneShuttingDownEndsRaftStreamsCleanly(t *testing.T) {
	logs := make([]*testutil.LockedBuffer, 3)
	for i := range logs {
		logs[i] = &testutil.LockedBuffer{}
	}
	nodes := startRaftCluster(t, 3, logs)
	leader := waitLeader(t, nodes, nil)
	applyCmds(t, leader, 0, 5)
	waitApplied(t, nodes, 5)
	// Every node now serves raft streams from the leader; the leader's node plane
	// stops, then a follower's.
	leader.tn.Close()
	rest := others(nodes, leader)
	waitLeader(t, rest, leader)
	rest[0].tn.Close()
	// Each side's stream readers end when the connections close: wait until no node
	// has a raft stream left (the third one's peers are both gone).
	for _, rn := range nodes {
		waitFor(t, rn.tn.NodeID()+"'s raft streams to end", 30*time.Second, func() bool {
			return rn.tn.Stats().RaftStreams == 0
		})
	}
	for i, rn := range nodes {
		if out := logs[i].String(); strings.Contains(out, "failed to decode incoming command") {
			t.Errorf("%s's raft transport logged a shutdown as an error:\n%s", rn.tn.NodeID(), out)
		}
	}
}

// applyCmds applies "cmd from" … "cmd to-1" through rn, which leads.
func applyCmds(t *testing.T, rn *raftNode, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := rn.raft.Apply(fmt.Appendf(nil, "cmd %d", i), 10*time.Second).Error(); err != nil {
			t.Fatalf("apply on %s: %v", rn.tn.NodeID(), err)
		}
	}
}

// others is nodes without not.
func others(nodes []*raftNode, not *raftNode) []*raftNode {
	var out []*raftNode
	for _, rn := range nodes {
		if rn != not {
			out = append(out, rn)
		}
	}
	return out
}

// startRaftCluster starts n raft servers over the stream layer of n node planes; each
// transport logs to logs[i] when logs is given.
func startRaftCluster(t *testing.T, n int, logs []*testutil.LockedBuffer) []*raftNode {
	t.Helper()
	var nodes []*raftNode
	var servers []raft.Server
	for i := range n {
		tn := mustStartNode(t, fmt.Sprintf("r%d", i), nil)
		nodes = append(nodes, &raftNode{tn: tn, fsm: &listFSM{}})
		servers = append(servers, raft.Server{ID: raft.ServerID(tn.NodeID()), Address: raft.ServerAddress(tn.Addr())})
	}
	for i, rn := range nodes {
		cfg := raft.DefaultConfig()
		cfg.LocalID = raft.ServerID(rn.tn.NodeID())
		cfg.HeartbeatTimeout = 500 * time.Millisecond
		cfg.ElectionTimeout = 500 * time.Millisecond
		cfg.LeaderLeaseTimeout = 250 * time.Millisecond
		cfg.CommitTimeout = 50 * time.Millisecond
		cfg.Logger = hclog.NewNullLogger()
		var out io.Writer = io.Discard
		if logs != nil {
			out = logs[i]
		}
		rn.trans = raft.NewNetworkTransport(rn.tn.StreamLayer(), 3, 5*time.Second, out)
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
	return nodes
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
