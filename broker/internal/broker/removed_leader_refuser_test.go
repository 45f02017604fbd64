package broker

import (
	"testing"
)

// TestARemovedLeaderWhoseFirstChoiceKeepsRefusingHandsOverToTheOther: as in
// TestARemovedLeaderWhoseHandoverWasRefusedHandsOverAgain, but only one of the two
// voters left refuses, and for good (a replica that failed a write and is not rebuilt
// yet, or whose reopening failed). The other could take the leadership: a leader its
// group no longer counts commits nothing, so until it hands over the partition takes
// no write. The target is the voter with the lowest raft id (both hold the whole log:
// a tie, which handOverTarget gives to the first).
func TestARemovedLeaderWhoseFirstChoiceKeepsRefusingHandsOverToTheOther(t *testing.T) {
	bs := startReplCluster(t, 3, false)
	var refused string
	hook := func(node, group string) bool { return node != refused }
	t.Cleanup(func() { mayLeadHook.Store(nil) })
	li, _, mv := leadWhileRemoved(t, bs, func(l string) {
		var low uint64
		for _, b := range bs {
			if id := raftID(b.meta.ServerID()); b.NodeID() != l && (low == 0 || id < low) {
				low, refused = id, b.NodeID()
			}
		}
		mayLeadHook.Store(&hook)
	})
	L := bs[li]
	t.Logf("%s leads removed; %s refuses any leadership", L.NodeID(), refused)
	moveEndsAndServes(t, bs, li, mv)
}
