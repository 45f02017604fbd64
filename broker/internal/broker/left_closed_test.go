package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/raftetcd"
)

// TestALeftClosedReplicaMovedOffCanComeBack: a node left its replica of a partition
// closed because the group's log (raft/) was damaged (leaveClosed), and the operator
// did the repair the docs give: a move of the replica to another node. The move
// deletes the closed copy. From then on the node holds nothing of the partition: it
// must no longer count a closed replica (narad_replicas_closed_damaged), and a later
// move of the partition back to it (a rebalance, an operator) must open a fresh
// replica there. On the old code the node kept the partition marked closed until it
// restarted: the gauge stayed 1, and the move back never opened the replica, so it
// stayed "copying" for good.
//
// The test reaches the left-closed state directly: the follower's replica is closed
// in place and marked as openTopic marks one whose raft/ fails its checks at a start.
func TestALeftClosedReplicaMovedOffCanComeBack(t *testing.T) {
	t.Parallel()
	bs := startReplCluster(t, 4, false)
	ctx := context.Background()
	li := hurtTopic(t, bs)
	m, _ := bs[0].meta.Topic("hurt")
	var victim, spare *Broker
	for k, b := range bs {
		switch {
		case k != li && slices.Contains(m.Placement[0].Replicas, b.NodeID()) && victim == nil:
			victim = b
		case !slices.Contains(m.Placement[0].Replicas, b.NodeID()):
			spare = b
		}
	}

	// Left closed, as openTopic leaves a replica whose raft/ is damaged.
	vt, err := victim.lookup("hurt")
	if err != nil {
		t.Fatal(err)
	}
	leaveClosedInPlace(t, victim, vt)
	gauge := func() float64 { return testutil.ToFloat64(victim.metrics.ReplicasClosed.WithLabelValues("hurt")) }
	if g := gauge(); g != 1 {
		t.Fatalf("narad_replicas_closed_damaged is %v, want 1", g)
	}

	waitMove := func(mv MoveInfo, what string) {
		t.Helper()
		waitOrFail(t, 60*time.Second, what, func() error {
			cur, _ := victim.meta.Move(parseMoveID(t, mv.ID))
			switch cur.Status {
			case meta.MoveDone:
				return nil
			case meta.MoveFailed, meta.MoveCancelled:
				t.Fatalf("%s: the move ended %s: %s", what, cur.Status, cur.Reason)
			}
			return fmt.Errorf("move %s is %s", mv.ID, cur.Status)
		})
	}
	// The repair: the closed replica moves to the node that holds none.
	mv, err := victim.StartMove(ctx, "hurt", 0, victim.NodeID(), spare.NodeID())
	if err != nil {
		t.Fatal(err)
	}
	waitMove(mv, "the move off the closed replica")
	waitOrFail(t, 10*time.Second, "the node no longer counts a closed replica once it holds none", func() error {
		if g := gauge(); g != 0 {
			return fmt.Errorf("narad_replicas_closed_damaged is %v, want 0: the replica moved off", g)
		}
		return nil
	})

	// Later the partition comes back to the node: it must open a fresh replica.
	back, err := victim.StartMove(ctx, "hurt", 0, spare.NodeID(), victim.NodeID())
	if err != nil {
		t.Fatal(err)
	}
	waitMove(back, "the move of the partition back to the node")
	waitOrFail(t, 30*time.Second, "the node's new replica holds the partition", func() error {
		if p := vt.parts()[0]; p == nil || p.Stats().End < 1 {
			return errors.New("not open, or empty")
		}
		return nil
	})
}

func parseMoveID(t *testing.T, id string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestALeftClosedReplicaTakenOverByForceOpens: the other replicas of a partition are
// lost for good while this node's replica is left closed (its raft/ damaged), and the
// operator takes the partition over by force on this node, the one live copy of its
// messages. A takeover starts a new group, with a Raft log of its own (raft-f<N>/):
// the node must open its replica in it, as a start does, and no longer count a closed
// replica. On the old code the mark of the damaged group kept the replica closed in the
// new group too, until the node restarted: the takeover answered 503 after 30 s and
// the partition had no leader.
func TestALeftClosedReplicaTakenOverByForceOpens(t *testing.T) {
	t.Parallel()
	bs := startReplCluster(t, 3, false)
	ctx := context.Background()
	li := hurtTopic(t, bs)
	victim := bs[(li+1)%len(bs)]
	vt := heldBy(t, victim)
	leaveClosedInPlace(t, victim, vt)

	fctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	if _, err := victim.ForceLeader(fctx, "hurt", 0, victim.NodeID()); err != nil {
		t.Fatalf("a forced takeover onto the node whose replica was left closed: %v", err)
	}
	if !vt.leads(0) {
		t.Fatal("the survivor does not lead the new group")
	}
	if g := testutil.ToFloat64(victim.metrics.ReplicasClosed.WithLabelValues("hurt")); g != 0 {
		t.Fatalf("narad_replicas_closed_damaged is %v after the replica opened in the new group, want 0", g)
	}
}

// TestAReplicaDamagedInBothItsStateAndItsGroupLogKeepsItsData: a replica whose queue
// state does not open is set aside and rebuilt from its group, which relies on the
// group's own log (raft/) here being intact. When that log is damaged too, the
// replica is left closed, and its data must stay as it is: it cannot be rebuilt here,
// and it may be the last copy of some messages (the group lost later, the partition
// taken over by force on this node). On the old code the data was set aside in
// damaged/ first, and only then was the group's log found damaged: a forced takeover
// here then started from an empty partition.
func TestAReplicaDamagedInBothItsStateAndItsGroupLogKeepsItsData(t *testing.T) {
	t.Parallel()
	bs := startReplCluster(t, 3, false)
	li := hurtTopic(t, bs)
	victim := bs[(li+1)%len(bs)]
	vt := heldBy(t, victim)
	dir := victim.partDir(vt, 0)
	// Closed, and both its epoch file and its group's state damaged, before the next
	// placement pass opens it again.
	closeReplicaInPlace(victim, vt, func() {
		for name, b := range map[string][]byte{"epoch": []byte("not an epoch"), filepath.Join("raft", "state"): bytes.Repeat([]byte{0xA5}, 200)} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Error(err)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	waitOrFail(t, 30*time.Second, "the placement pass to leave the replica closed", func() error {
		if !victim.leftClosed(vt, 0, vt.gid(0)) {
			return errors.New("not left closed")
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(dir, "damaged")); err == nil {
		t.Fatalf("the data of a replica left closed was set aside in damaged/ (%s)", dir)
	}
	for _, name := range []string{"epoch", "log"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("the %s of a replica left closed is gone from its place: %v", name, err)
		}
	}
	if n := testutil.ToFloat64(victim.metrics.ReplicaRebuilds.WithLabelValues("hurt")); n != 0 {
		t.Fatalf("narad_replica_rebuilds_total is %v for a replica that was left closed, not rebuilt", n)
	}
}

// hurtTopic creates topic hurt (one partition, three replicas) on bs, produces one
// message to it, and returns the index of its leader.
func hurtTopic(t *testing.T, bs []*Broker) int {
	t.Helper()
	ctx := context.Background()
	if _, err := bs[0].CreateTopic(ctx, TopicSpec{Name: "hurt", Partitions: ptr[int32](1), ReplicationFactor: ptr[int32](3)}); err != nil {
		t.Fatal(err)
	}
	waitOrFail(t, 30*time.Second, "a first produce", func() error {
		_, err := bs[0].Produce(ctx, "hurt", []Outgoing{{Partition: 0, Value: []byte("before")}})
		return err
	})
	li := -1
	waitOrFail(t, 30*time.Second, "a leader", func() error {
		if li = leaderIndex(bs, "hurt", 0); li < 0 {
			return errors.New("none")
		}
		return nil
	})
	return li
}

// heldBy returns b's topic hurt once its replica of partition 0 holds the message.
func heldBy(t *testing.T, b *Broker) *topic {
	t.Helper()
	vt, err := b.lookup("hurt")
	if err != nil {
		t.Fatal(err)
	}
	waitOrFail(t, 30*time.Second, "the follower holds the message", func() error {
		if vt.parts()[0].Stats().End < 1 {
			return errors.New("not yet")
		}
		return nil
	})
	return vt
}

// closeReplicaInPlace closes b's replica of hurt/0 as a placement pass does before it opens
// the replica again; b.placeMu is held while do runs, if given.
func closeReplicaInPlace(b *Broker, vt *topic, do func()) {
	b.placeMu.Lock()
	defer b.placeMu.Unlock()
	lp := vt.parts()[0]
	b.closeReplica(vt, 0)
	vt.setPart(0, nil)
	_ = lp.Close()
	if do != nil {
		do()
	}
}

// leaveClosedInPlace closes b's replica of hurt/0 and marks it left closed, as
// openTopic leaves a replica whose raft/ fails its checks at a start.
func leaveClosedInPlace(t *testing.T, b *Broker, vt *topic) {
	t.Helper()
	closeReplicaInPlace(b, vt, func() {
		if !b.leaveClosed(vt, *vt.cur.Load(), 0, fmt.Errorf("opening: %w: state: neither state slot is valid", raftetcd.ErrCorrupt)) {
			t.Error("the replica was not left closed")
		}
	})
	if t.Failed() {
		t.FailNow()
	}
}
