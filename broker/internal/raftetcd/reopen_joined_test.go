package raftetcd

import (
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// TestAJoinedVoterReopenedBeforeItsFirstEntryKeepsItsTermAndHold: a replica that joined
// a group (an empty log) and answered its leader's heartbeat has written the leader's
// term and nothing else. Opened again after a restart without Join (the broker asks to
// join only when the Raft directory is new), it counted the group as new and
// bootstrapped it, back to term 1 with no vote and no hold of its vote: it could vote
// twice in one term, and a leader whose lease counted its answer could be deposed at
// once. It keeps its term and holds its vote now, as any reopened replica does. Found
// by an adversarial review (5 December); fails on the old code.
func TestAJoinedVoterReopenedBeforeItsFirstEntryKeepsItsTermAndHold(t *testing.T) {
	t.Parallel()
	const g = "joined"
	ns := startClusterWith(t, 0, func(o *Options) { o.NoQuiesce = true; o.Store = StoreRaftstore })
	n := ns[0]
	dir := filepath.Join(n.opts.Dir, g)
	if err := n.host.OpenGroup(g, GroupConfig{Dir: dir, Join: true}); err != nil {
		t.Fatal(err)
	}
	// Its leader (node 2, term 7) speaks to it; it answers, and writes term 7.
	n.host.group(g).step(0, raftpb.Message{Type: raftpb.MsgHeartbeat, From: 2, To: n.id, Term: 7, Context: []byte("12345678")})
	poll(t, 30*time.Second, "term 7 written", func() bool {
		gr := n.host.group(g)
		gr.mu.Lock()
		defer gr.mu.Unlock()
		hs, _, err := gr.st.InitialState()
		return err == nil && hs.Term == 7
	})
	n.host.CloseGroup(g)
	if err := n.host.OpenGroup(g, GroupConfig{Voters: []uint64{1, 2, 3}, Dir: dir}); err != nil {
		t.Fatal(err)
	}
	gr := n.host.group(g)
	gr.mu.Lock()
	heard, term := gr.lease.heard, gr.rn.BasicStatus().Term
	gr.mu.Unlock()
	if term < 7 || heard == 0 {
		t.Fatalf("reopened after answering its leader of term 7: term %d, holding its vote from its opening: %v", term, heard != 0)
	}
}
