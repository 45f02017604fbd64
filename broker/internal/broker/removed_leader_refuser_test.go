package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
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
	waitOrFail(t, 30*time.Second, "the move ends", func() error {
		m, _ := L.meta.Move(mv.ID)
		if m.Status != meta.MoveDone {
			return fmt.Errorf("move %d is %s", mv.ID, m.Status)
		}
		return nil
	})
	other := bs[(li+1)%len(bs)]
	waitOrFail(t, 30*time.Second, "a produce through another node", func() error {
		pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := other.Produce(pctx, "mv", []Outgoing{{Partition: 0, Value: []byte("after")}})
		return err
	})
}
