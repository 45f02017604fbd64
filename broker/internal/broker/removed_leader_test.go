package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/raftetcd"
)

// TestARemovedSourceThatLeadsHandsOverBeforeItCloses: a move takes the replica off
// node L (here the removal a lowered replication factor starts), and L itself, as
// leader, commits the configuration change that removes it: the leader that proposed
// it died (or handed over) before it committed, and L, elected, committed it with its
// first entry. etcd-io/raft keeps a leader removed from the configuration leading. The
// partition must be served again once the move ends. On the old code L's placement
// pass deleted its copy under its own leadership, handing nothing over: the
// followers, quiesced by that idle leader, never ticked again while L's node lived, and
// every produce answered 503.
//
// The test reaches that state directly: right after the move starts, L (leading)
// proposes its own removal, as the successor of the leader that proposed it would
// commit it.
func TestARemovedSourceThatLeadsHandsOverBeforeItCloses(t *testing.T) {
	bs := startReplCluster(t, 3, false)
	ctx := context.Background()
	tm, err := bs[0].CreateTopic(ctx, TopicSpec{Name: "mv", Partitions: ptr[int32](1), ReplicationFactor: ptr[int32](3)})
	if err != nil {
		t.Fatal(err)
	}
	waitOrFail(t, 30*time.Second, "a first produce", func() error {
		_, err := bs[0].Produce(ctx, "mv", []Outgoing{{Partition: 0, Value: []byte("before")}})
		return err
	})
	li := -1
	waitOrFail(t, 30*time.Second, "a leader", func() error {
		if li = leaderIndex(bs, "mv", 0); li < 0 {
			return errors.New("none")
		}
		return nil
	})
	L := bs[li]
	lt, err := L.lookup("mv")
	if err != nil {
		t.Fatal(err)
	}
	gid := lt.gid(0)
	self := raftID(L.meta.ServerID())
	mv, err := L.meta.StartMove(meta.Move{Topic: "mv", Incarnation: tm.Incarnation, Partition: 0, From: L.NodeID(), Cause: meta.CauseRF})
	if err != nil {
		t.Fatal(err)
	}
	if err := L.repl.host.ChangeConf(gid, raftetcd.ConfChange{RemoveVoters: []uint64{self}}); err != nil {
		t.Fatal(err)
	}
	if _, err := L.meta.SetReplicationFactor("mv", tm.Incarnation, 2); err != nil {
		t.Fatal(err)
	}
	waitOrFail(t, 5*time.Second, "L applied its own removal and leads on", func() error {
		info, ok := L.repl.host.Info(gid)
		if !ok || !info.Leader || slices.Contains(info.Voters, self) {
			return fmt.Errorf("precondition not reached (a handover won the race): %+v %v", info, ok)
		}
		return nil
	})
	t.Logf("%s leads partition 0 without being a voter of its group", L.NodeID())
	waitOrFail(t, 30*time.Second, "the move ends", func() error {
		m, _ := L.meta.Move(mv.ID)
		if m.Status != meta.MoveDone {
			return fmt.Errorf("move %d is %s", mv.ID, m.Status)
		}
		return nil
	})
	t.Logf("the move is done")
	other := bs[(li+1)%len(bs)]
	start := time.Now()
	var last error
	for time.Since(start) < 25*time.Second {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := other.Produce(pctx, "mv", []Outgoing{{Partition: 0, Value: []byte("after")}})
		cancel()
		if err == nil {
			t.Logf("produce after the move succeeded %v after it ended", time.Since(start).Round(time.Millisecond))
			return
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	var leads []string
	for _, b := range bs {
		if info, ok := b.repl.host.Info(gid); ok {
			leads = append(leads, fmt.Sprintf("%s: open, leader=%v, lead=%s, quiesced=%v", b.NodeID(), info.Leader, b.nodeOf(info.Lead), info.Quiesced))
		} else {
			leads = append(leads, fmt.Sprintf("%s: group closed", b.NodeID()))
		}
	}
	t.Fatalf("25 s after the move ended the partition still takes no produce (%v); groups: %v", last, leads)
}
