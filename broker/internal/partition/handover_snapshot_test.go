package partition

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/queue"
)

// TestReplicaCalledOffHandOverIsForgottenByASnapshotRestore: as
// TestReplicaCalledOffHandOverIsNotTakenAfterAFailover, but the follower elected
// next applied the handover's L command and then fell behind: it missed the L that
// called the handover off, and caught up by restoring a snapshot taken after it (a
// replica restarted or slow, or a move's learner, once the log was compacted). The
// handed leases are memory only (no snapshot carries them), and the restore kept
// them: the follower, elected in the next term, took the leases of the handover called
// off as handed to it. The nacked message was held under the nacked handle (its ack
// answered 204) and came back with an attempt below the one last served. Fails on the
// old code.
func TestReplicaCalledOffHandOverIsForgottenByASnapshotRestore(t *testing.T) {
	g, ps := openGroup(t, 3)
	appendN(t, ps[0], 1)
	first, err := ps[0].Lease(1, time.Minute, 1<<20)
	if err != nil || len(first) != 1 {
		t.Fatalf("leased %d: %v", len(first), err)
	}
	if err := ps[0].HandOver(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The third replica applied the L, and then hears nothing more for a while.
	g.mu.Lock()
	behind := g.replicas[2]
	g.replicas = g.replicas[:2]
	g.mu.Unlock()
	if err := ps[0].ResumeAfterHandOver(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := ps[0].Extend(first[0].Record.Offset, first[0].Nonce, 0); err != nil { // a nack
		t.Fatal(err)
	}
	second, err := ps[0].Lease(1, time.Minute, 1<<20)
	if err != nil || len(second) != 1 || second[0].Attempt != 2 {
		t.Fatalf("redelivered %+v: %v", second, err)
	}
	snap, err := ps[0].SnapshotState()
	if err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	index := uint64(len(g.log))
	g.mu.Unlock()
	if err := behind.RestoreSnapshot(context.Background(), index, snap, fetchFrom(ps[0], 100)); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.replicas = append(g.replicas, behind)
	g.mu.Unlock()
	g.moveLead(2, 2) // the leader dies; the one behind wins the election of term 2
	got := leaseAll(t, behind)
	if len(got) != 1 {
		if err := behind.Settle([]SettleReq{{Offset: first[0].Record.Offset, Nonce: first[0].Nonce}})[0]; err == nil {
			t.Error("the handle nacked on the old leader settled on the new one")
		} else if !errors.Is(err, queue.ErrLeaseLost) {
			t.Error(err)
		}
		t.Fatalf("after the failover the message is not ready (%d leased): the handed lease of the handover called off holds it", len(got))
	}
	if got[0].Attempt < 3 {
		t.Fatalf("a message delivered twice before the failover comes with attempt %d; want at least 3", got[0].Attempt)
	}
}
