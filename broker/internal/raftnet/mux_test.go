package raftnet

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/transport"
)

var testSecret = []byte("raftnet-test-secret-0123456789ab")

// counterFSM counts the entries applied to it.
type counterFSM struct{ n atomic.Int64 }

func (f *counterFSM) Apply(*raft.Log) any { return f.n.Add(1) }
func (f *counterFSM) Snapshot() (raft.FSMSnapshot, error) {
	return nil, fmt.Errorf("the test FSM takes no snapshots")
}
func (f *counterFSM) Restore(io.ReadCloser) error { return nil }

type testNode struct {
	node  *transport.Node
	mux   *Mux
	rafts map[string]*raft.Raft
	fsms  map[string]*counterFSM
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// mustStartCluster starts nodes node-plane nodes, each with a mux, and groups raft
// groups of three voters across them, in memory.
func mustStartCluster(t *testing.T, nodes, groups int, tick time.Duration) []*testNode {
	t.Helper()
	ns := make([]*testNode, nodes)
	for i := range ns {
		n, err := transport.New(transport.Options{NodeID: fmt.Sprintf("n%d", i+1), ListenAddr: "127.0.0.1:0", Secret: testSecret, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(Options{Node: n, Tick: tick, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		ns[i] = &testNode{node: n, mux: m, rafts: map[string]*raft.Raft{}, fsms: map[string]*counterFSM{}}
	}
	var servers []raft.Server
	for i, n := range ns {
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(fmt.Sprintf("n%d", i+1)), Address: raft.ServerAddress(n.node.Addr())})
	}
	for g := range groups {
		group := fmt.Sprintf("g%03d", g)
		for i, n := range ns {
			conf := raft.DefaultConfig()
			conf.LocalID = servers[i].ID
			conf.HeartbeatTimeout = 500 * time.Millisecond
			conf.ElectionTimeout = 500 * time.Millisecond
			conf.LeaderLeaseTimeout = 250 * time.Millisecond
			conf.CommitTimeout = 200 * time.Millisecond
			conf.Logger = hclog.NewNullLogger()
			tr, err := n.mux.Transport(group)
			if err != nil {
				t.Fatal(err)
			}
			store := raft.NewInmemStore()
			fsm := &counterFSM{}
			if err := raft.BootstrapCluster(conf, store, store, raft.NewInmemSnapshotStore(), tr, raft.Configuration{Servers: servers}); err != nil {
				t.Fatal(err)
			}
			r, err := raft.NewRaft(conf, fsm, store, store, raft.NewInmemSnapshotStore(), tr)
			if err != nil {
				t.Fatal(err)
			}
			n.rafts[group], n.fsms[group] = r, fsm
		}
	}
	t.Cleanup(func() {
		for _, n := range ns {
			for _, r := range n.rafts {
				r.Shutdown()
			}
		}
		for _, n := range ns {
			n.mux.Close()
			n.node.Close()
		}
	})
	return ns
}

func waitFor(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", bound, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func leaderOf(ns []*testNode, group string) *raft.Raft {
	for _, n := range ns {
		if r := n.rafts[group]; r.State() == raft.Leader {
			return r
		}
	}
	return nil
}

// applyAsAClient applies one entry through the group's leader and, like any client of
// a Raft group, applies it again through the next leader when leadership moved while it
// was committing: on a loaded machine 60 groups on 2 cores may miss a heartbeat. The
// counting FSM then sees the entry once or twice, which the test's ">= 5" allows. More
// than a handful of leader changes for one entry is a failure, not load.
func applyAsAClient(t *testing.T, ns []*testNode, group string, entry []byte) {
	t.Helper()
	const maxLeaderChanges = 5
	for try := 0; ; try++ {
		var leader *raft.Raft
		waitFor(t, "a leader of "+group, 30*time.Second, func() bool { leader = leaderOf(ns, group); return leader != nil })
		err := leader.Apply(entry, 10*time.Second).Error()
		if err == nil {
			return
		}
		if (errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrNotLeader)) && try < maxLeaderChanges {
			t.Logf("Apply on %s: %v; applying through the next leader", group, err)
			continue
		}
		t.Fatalf("Apply on %s (after %d leader changes): %v", group, try, err)
	}
}

func TestGroupsElectAndReplicate(t *testing.T) {
	const groups = 20
	ns := mustStartCluster(t, 3, groups, 20*time.Millisecond)
	for g := range groups {
		group := fmt.Sprintf("g%03d", g)
		for i := range 5 {
			applyAsAClient(t, ns, group, fmt.Appendf(nil, "%s-%d", group, i))
		}
	}
	// Followers learn the commit index from the batched commit notices.
	for g := range groups {
		group := fmt.Sprintf("g%03d", g)
		for i, n := range ns {
			waitFor(t, fmt.Sprintf("node %d applying %s", i+1, group), 30*time.Second, func() bool { return n.fsms[group].n.Load() >= 5 })
		}
	}
	var rpc uint64
	for _, n := range ns {
		rpc += n.mux.Stats().RPCCalls
	}
	if rpc == 0 {
		t.Fatal("entries were replicated without a single RPC call")
	}
}

// TestHeartbeatsAreCoalesced checks that an idle cluster's heartbeats travel many
// groups to a frame: the frames per node pair follow the tick, not the group count.
func TestHeartbeatsAreCoalesced(t *testing.T) {
	const groups = 20
	const tick = 100 * time.Millisecond
	ns := mustStartCluster(t, 3, groups, tick)
	for g := range groups {
		group := fmt.Sprintf("g%03d", g)
		waitFor(t, "a leader of "+group, 30*time.Second, func() bool { return leaderOf(ns, group) != nil })
	}
	before := make([]Stats, len(ns))
	for i, n := range ns {
		before[i] = n.mux.Stats()
	}
	const window = 2 * time.Second
	time.Sleep(window) // the measured window itself, not a wait for a condition
	var calls, items, rpcs uint64
	for i, n := range ns {
		s := n.mux.Stats()
		calls += s.BatchCalls - before[i].BatchCalls
		items += s.BatchItems - before[i].BatchItems
		rpcs += s.RPCCalls - before[i].RPCCalls
	}
	// 20 groups × 2 followers each get a heartbeat every 150–200 ms (HeartbeatTimeout/10
	// to /5, plus up to a tick in the batch): ~200–270/s.
	if items < 200 {
		t.Fatalf("only %d heartbeats in %v: raft is not heartbeating through the batches", items, window)
	}
	// 6 directed node pairs, one frame per tick at most (with room for a late tick).
	maxCalls := uint64(6 * (window / tick) * 3 / 2)
	if calls > maxCalls {
		t.Fatalf("%d frames for %d heartbeats in %v; want at most %d (one per pair per tick)", calls, items, window, maxCalls)
	}
	if items < 3*calls {
		t.Fatalf("%d heartbeats in %d frames: not coalesced", items, calls)
	}
	// Heartbeats ride the batches; a single RPC is a vote or an append, which a loaded
	// machine can cause (a follower that missed its heartbeats campaigns: 40 against
	// 437 heartbeats in a make test beside a soak run). Some are fine; heartbeats sent
	// one by one would be as many as the batched ones.
	if rpcs*4 > items {
		t.Fatalf("%d single RPCs against %d batched heartbeats while idle: heartbeats are not all batched", rpcs, items)
	}
	t.Logf("idle %v: %d heartbeats in %d frames", window, items, calls)
}
