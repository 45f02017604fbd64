package raftstore

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"strings"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// A three-node etcd-io/raft cluster in memory, each node's log in a Store on its own
// vfs.Mem, messages passed in-process after each Ready is persisted. The state
// machine is the list of applied payloads; a snapshot's Data is that list, small,
// as a partition's referential snapshot is.

type testNode struct {
	id      uint64
	mem     *vfs.Mem
	store   *Store
	rn      *raft.RawNode
	applied []string // payloads of applied normal entries, in order
	index   uint64   // last applied index
}

type testCluster struct {
	t        *testing.T
	nodes    []*testNode
	msgs     []raftpb.Message
	isolated map[uint64]bool
}

var quietLogger = &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}

func (c *testCluster) start(n *testNode, applied uint64) {
	c.t.Helper()
	rn, err := raft.NewRawNode(&raft.Config{
		ID: n.id, ElectionTick: 10, HeartbeatTick: 1, Storage: n.store, Applied: applied,
		MaxSizePerMsg: 4096, MaxInflightMsgs: 256, CheckQuorum: true, PreVote: true, Logger: quietLogger,
	})
	if err != nil {
		c.t.Fatalf("node %d: NewRawNode: %v", n.id, err)
	}
	n.rn = rn
}

func newTestCluster(t *testing.T) *testCluster {
	c := &testCluster{t: t, isolated: map[uint64]bool{}}
	for id := uint64(1); id <= 3; id++ {
		n := &testNode{id: id, mem: vfs.NewMem()}
		s, err := Open(testDir, Options{FS: n.mem, SegmentBytes: 512, CacheEntries: 8})
		if err != nil {
			t.Fatal(err)
		}
		// Bootstrap as the spike does: index 1, term 1 holds the membership.
		if err := s.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 1, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}); err != nil {
			t.Fatal(err)
		}
		n.store, n.index = s, 1
		c.start(n, 1)
		c.nodes = append(c.nodes, n)
	}
	return c
}

// handle runs one node's Ready loop until it has nothing ready: persist, then send,
// then apply, then advance.
func (c *testCluster) handle(n *testNode) {
	for n.rn.HasReady() {
		rd := n.rn.Ready()
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := n.store.ApplySnapshot(rd.Snapshot); err != nil {
				c.t.Fatalf("node %d: ApplySnapshot: %v", n.id, err)
			}
			if err := json.Unmarshal(rd.Snapshot.Data, &n.applied); err != nil {
				c.t.Fatalf("node %d: snapshot data: %v", n.id, err)
			}
			n.index = rd.Snapshot.Metadata.Index
		}
		if err := n.store.Save(rd.HardState, rd.Entries); err != nil {
			c.t.Fatalf("node %d: Save: %v", n.id, err)
		}
		c.msgs = append(c.msgs, rd.Messages...)
		for _, e := range rd.CommittedEntries {
			if e.Index <= n.index {
				continue // applied before a restart; applying is idempotent by index
			}
			if e.Type == raftpb.EntryNormal && len(e.Data) > 0 {
				n.applied = append(n.applied, string(e.Data))
			}
			n.index = e.Index
		}
		n.rn.Advance(rd)
	}
}

// settle delivers messages and runs Ready loops until nothing moves.
func (c *testCluster) settle() {
	for round := 0; ; round++ {
		if round > 10000 {
			c.t.Fatal("the cluster did not settle")
		}
		for _, n := range c.nodes {
			c.handle(n)
		}
		if len(c.msgs) == 0 {
			return
		}
		msgs := c.msgs
		c.msgs = nil
		for _, m := range msgs {
			if c.isolated[m.From] || c.isolated[m.To] {
				continue
			}
			to := c.nodes[m.To-1]
			if err := to.rn.Step(m); err != nil {
				c.t.Fatalf("node %d: Step(%v): %v", m.To, m.Type, err)
			}
			if m.Type == raftpb.MsgSnap {
				c.nodes[m.From-1].rn.ReportSnapshot(m.To, raft.SnapshotFinish)
			}
		}
	}
}

func (c *testCluster) tick() {
	for _, n := range c.nodes {
		n.rn.Tick()
	}
	c.settle()
}

// leader ticks until one of the nodes in among leads with a quorum behind it.
func (c *testCluster) leader(among ...uint64) *testNode {
	c.t.Helper()
	for range 2000 {
		c.tick()
		for _, id := range among {
			if n := c.nodes[id-1]; n.rn.Status().RaftState == raft.StateLeader {
				return n
			}
		}
	}
	c.t.Fatalf("no leader among %v after 2000 ticks", among)
	return nil
}

func (c *testCluster) propose(n *testNode, prefix string, count int) {
	c.t.Helper()
	for i := range count {
		if err := n.rn.Propose([]byte(prefix + string(rune('0'+i)))); err != nil {
			c.t.Fatalf("node %d: Propose: %v", n.id, err)
		}
		c.settle()
	}
}

// waitApplied ticks until every listed node has applied want payloads.
func (c *testCluster) waitApplied(want int, ids ...uint64) {
	c.t.Helper()
	for range 2000 {
		done := true
		for _, id := range ids {
			if len(c.nodes[id-1].applied) < want {
				done = false
			}
		}
		if done {
			return
		}
		c.tick()
	}
	for _, id := range ids {
		c.t.Logf("node %d applied %v", id, c.nodes[id-1].applied)
	}
	c.t.Fatalf("nodes %v did not apply %d entries", ids, want)
}

// restart crashes a node's disk (losing whatever was not synced) and starts it
// again from its store.
func (c *testCluster) restart(n *testNode) {
	c.t.Helper()
	n.mem.Crash()
	s, err := Open(testDir, Options{FS: n.mem, SegmentBytes: 512, CacheEntries: 8})
	if err != nil {
		c.t.Fatalf("node %d: reopen after a crash: %v", n.id, err)
	}
	n.store = s
	hs := s.HardState()
	// Applied may be ahead of the durable commit index (commit-only hard states
	// are not synced); raft must be started at most at the commit index, and
	// re-applying is idempotent by index.
	c.start(n, min(n.index, hs.Commit))
}

func others(of uint64) []uint64 {
	var out []uint64
	for id := uint64(1); id <= 3; id++ {
		if id != of {
			out = append(out, id)
		}
	}
	return out
}

// TestRaftClusterOnStores drives three raft nodes on stores through proposals, a
// leader cut off with an uncommitted tail while the others elect a leader and
// commit over the same indexes (the old leader's store must cut its divergent
// suffix when it rejoins), a crash and restart of that node from its store, a
// follower brought back by a snapshot after the leader compacted, and checks that
// every node ends with the same committed log and the same applied state.
func TestRaftClusterOnStores(t *testing.T) {
	c := newTestCluster(t)
	l1 := c.leader(1, 2, 3)
	c.propose(l1, "a", 10)
	c.waitApplied(10, 1, 2, 3)

	// The leader is cut off and takes proposals it can never commit.
	c.isolated[l1.id] = true
	lastBefore, _ := l1.store.LastIndex()
	c.propose(l1, "x", 5)
	if last, _ := l1.store.LastIndex(); last != lastBefore+5 {
		t.Fatalf("the cut-off leader stored up to %d, want %d", last, lastBefore+5)
	}
	rest := others(l1.id)
	l2 := c.leader(rest...)
	c.propose(l2, "b", 3)
	c.waitApplied(13, rest...)

	// It rejoins: the new leader overwrites its uncommitted tail.
	delete(c.isolated, l1.id)
	c.waitApplied(13, 1, 2, 3)
	if st := l1.store.Stats(); st.Cuts == 0 || st.CutEntries == 0 {
		t.Fatalf("the old leader's store made no cut (stats %+v)", st)
	}

	t.Logf("leader %d cut off; leader %d elected; the old leader's cuts: %+v", l1.id, l2.id, l1.store.Stats())

	// It crashes and restarts from its store.
	c.restart(l1)
	l3 := c.leader(1, 2, 3)
	c.propose(l3, "c", 5)
	c.waitApplied(18, 1, 2, 3)
	if from, to := c.sameCommitted(); from != 2 || to < l3.index {
		t.Fatalf("after the restart the nodes share committed entries [%d, %d], want [2, %d]", from, to, l3.index)
	}

	// A follower is cut off while the leader commits more and compacts past it; it
	// comes back through a snapshot.
	f := c.nodes[others(l3.id)[0]-1]
	c.isolated[f.id] = true
	c.propose(l3, "d", 5)
	c.waitApplied(23, others(f.id)...)
	data, _ := json.Marshal(l3.applied)
	if _, err := l3.store.CreateSnapshot(l3.index, nil, data); err != nil {
		t.Fatal(err)
	}
	if err := l3.store.Compact(l3.index); err != nil {
		t.Fatal(err)
	}
	delete(c.isolated, f.id)
	c.waitApplied(23, 1, 2, 3)
	if sn, _ := f.store.Snapshot(); sn.Metadata.Index != l3.index {
		t.Fatalf("the follower's snapshot is at %d, want the leader's %d", sn.Metadata.Index, l3.index)
	}
	c.propose(l3, "e", 2)
	c.waitApplied(25, 1, 2, 3)
	for _, n := range c.nodes {
		first, _ := n.store.FirstIndex()
		last, _ := n.store.LastIndex()
		sn, _ := n.store.Snapshot()
		t.Logf("node %d: log [%d, %d], snapshot at %d, hard state %+v, stats %+v", n.id, first, last, sn.Metadata.Index, n.store.HardState(), n.store.Stats())
	}

	// Every node: same applied state, same committed log where their logs overlap.
	want := c.nodes[0].applied
	for _, n := range c.nodes {
		if strings.Join(n.applied, ",") != strings.Join(want, ",") {
			t.Fatalf("node %d applied %v; node 1 applied %v", n.id, n.applied, want)
		}
		for _, p := range n.applied {
			if strings.HasPrefix(p, "x") {
				t.Fatalf("node %d applied %q, which was never committed", n.id, p)
			}
		}
	}
	from, to := c.sameCommitted()
	// And they survive one more restart of every node.
	for _, n := range c.nodes {
		if err := n.store.Close(); err != nil {
			t.Fatal(err)
		}
		s := openOn(t, n.mem, Options{SegmentBytes: 512, CacheEntries: 8})
		ents, err := s.Entries(from, to+1, ^uint64(0))
		if err != nil || uint64(len(ents)) != to-from+1 {
			t.Fatalf("node %d after reopen: %d entries, %v", n.id, len(ents), err)
		}
		_ = s.Close() // read only
	}
}

// sameCommitted checks that the nodes' stores hold the same committed entries
// where their logs overlap, and returns that range.
func (c *testCluster) sameCommitted() (from, to uint64) {
	c.t.Helper()
	t := c.t
	logs := map[uint64][]raftpb.Entry{}
	from, to = 0, ^uint64(0)
	for _, n := range c.nodes {
		first, _ := n.store.FirstIndex()
		commit := n.store.HardState().Commit
		from, to = max(from, first), min(to, commit)
		ents, err := n.store.Entries(first, commit+1, ^uint64(0))
		if err != nil {
			t.Fatalf("node %d: Entries(%d, %d): %v", n.id, first, commit+1, err)
		}
		logs[n.id] = ents
	}
	if from > to {
		t.Fatalf("the nodes' committed logs do not overlap: [%d, %d]", from, to)
	}
	b0, _ := c.nodes[0].store.FirstIndex()
	b := logs[1][from-b0 : to-b0+1]
	for _, n := range c.nodes {
		first, _ := n.store.FirstIndex()
		a := logs[n.id][from-first : to-first+1]
		for i := range a {
			if a[i].Index != b[i].Index || a[i].Term != b[i].Term || !bytes.Equal(a[i].Data, b[i].Data) {
				t.Fatalf("node %d entry %d (term %d, %q) differs from node 1's (term %d, %q)", n.id, a[i].Index, a[i].Term, a[i].Data, b[i].Term, b[i].Data)
			}
			if bytes.HasPrefix(a[i].Data, []byte("x")) {
				t.Fatalf("node %d holds %q at committed index %d; it was never committed", n.id, a[i].Data, a[i].Index)
			}
		}
	}
	return from, to
}
