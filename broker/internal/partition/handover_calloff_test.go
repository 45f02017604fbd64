package partition

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/queue"
)

// handOverCalledOff opens a group of three replicas, the first leading; it leases the
// one message there, hands over (the L command committed), and calls the handover off
// (ResumeAfterHandOver), as a leader whose transfer did not happen does.
func handOverCalledOff(t *testing.T) (*fakeGroup, []*Partition, []Delivery) {
	t.Helper()
	g, ps := openGroup(t, 3)
	appendN(t, ps[0], 1)
	leased, err := ps[0].Lease(1, time.Minute, 1<<20)
	if err != nil || len(leased) != 1 {
		t.Fatalf("leased %d: %v", len(leased), err)
	}
	if err := ps[0].HandOver(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := ps[0].ResumeAfterHandOver(context.Background()); err != nil {
		t.Fatal(err)
	}
	return g, ps, leased
}

// TestReplicaCalledOffHandOverIsNotTakenAfterAFailover: a handover whose transfer did
// not happen left its L command (handing term 1) on every replica. The leader served
// on (ResumeAfterHandOver): here the holder nacks and the message goes to another
// consumer, attempt 2. When the leader then dies, the replica elected in term 2 took
// the stale L as handed to it: the nacked message was held under the nacked handle,
// that handle's ack answered 204, and the message came back later as attempt 2 again.
// The leader now commits an L handing nothing before it serves on, so the successor
// counts as elected: the message is ready at once and counts on. Found by an
// adversarial review (5 December); fails on the old code.
func TestReplicaCalledOffHandOverIsNotTakenAfterAFailover(t *testing.T) {
	g, ps, first := handOverCalledOff(t)
	if err := ps[0].Extend(first[0].Record.Offset, first[0].Nonce, 0); err != nil { // a nack
		t.Fatal(err)
	}
	second, err := ps[0].Lease(1, time.Minute, 1<<20)
	if err != nil || len(second) != 1 || second[0].Attempt != 2 {
		t.Fatalf("redelivered %+v: %v", second, err)
	}
	g.moveLead(1, 2) // the leader dies; the next election is term 2
	if g.replicas[1].repl.handed != nil {
		t.Error("the handover called off is still remembered by a follower")
	}
	got := leaseAll(t, ps[1])
	if len(got) != 1 {
		if err := ps[1].Settle([]SettleReq{{Offset: first[0].Record.Offset, Nonce: first[0].Nonce}})[0]; err == nil {
			t.Error("the handle nacked on the old leader settled on the new one")
		} else if !errors.Is(err, queue.ErrLeaseLost) {
			t.Error(err)
		}
		t.Fatalf("after the failover the message is not ready (%d leased): the stale handed lease holds it", len(got))
	}
	if got[0].Attempt < 3 {
		t.Fatalf("a message delivered twice before the failover comes with attempt %d; want at least 3", got[0].Attempt)
	}
}

// TestReplicaAFailoverAfterACalledOffHandOverCountsAsElected: the leader taken after
// the old leader called its handover off and died is an election (its leases were the
// old leader's memory), not a handover, in what SetRole reports (the metric
// narad_partition_leaderships_taken_total{how}).
func TestReplicaAFailoverAfterACalledOffHandOverCountsAsElected(t *testing.T) {
	g, ps, _ := handOverCalledOff(t)
	g.mu.Lock()
	g.lead = 1
	g.mu.Unlock()
	ps[0].SetRole(false, 0)
	if ps[1].SetRole(true, 2) {
		t.Fatal("a leadership won after the handover was called off counts as handed over")
	}
}

// TestReplicaCalledOffHandOverIsForgottenAtARestart: a follower that applies the
// group's log again at a restart applies the stale L again, with its time left
// counted from then (an entry read back has no arrival time); it must apply the L
// that called it off too, so that nothing revives the handed leases.
func TestReplicaCalledOffHandOverIsForgottenAtARestart(t *testing.T) {
	g, ps, _ := handOverCalledOff(t)
	g.mu.Lock()
	log := append([][]byte(nil), g.log...)
	g.mu.Unlock()
	f := ps[2]
	for i, cmd := range log {
		f.Apply(uint64(i+1), cmd) // the whole log again, as at a restart
	}
	f.repl.handMu.Lock()
	handed := f.repl.handed
	f.repl.handMu.Unlock()
	if handed != nil {
		t.Fatalf("after applying the log again a follower holds %d handed leases of a handover called off", len(handed))
	}
}

// settleGate holds back the S command of an ack until the gate closes.
type settleGate struct {
	member
	gate    chan struct{}
	waiting *atomic.Bool
}

func (m settleGate) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	if len(cmd) > 0 && cmd[0] == cmdSettle {
		m.waiting.Store(true)
		<-m.gate
	}
	return m.member.Propose(ctx, cmd, submitted)
}

// TestReplicaHandOverKeepsALeaseWhoseAckIsInFlight: an ack had pinned its lease when
// the handover read the live leases, and its S command reached the group only after
// the transfer began, which drops it: the ack failed and the lease went back to the
// old leader, but the successor had never heard of it and leased the message to
// another consumer at once, while the holder's lease ran (its ack sent again got
// 410). The lease being settled is handed over now. Found by an adversarial review
// (5 December); fails on the old code.
func TestReplicaHandOverKeepsALeaseWhoseAckIsInFlight(t *testing.T) {
	gate := make(chan struct{})
	waiting := &atomic.Bool{}
	g, ps := openGroupWith(t, 3, func(m member) Group { return settleGate{m, gate, waiting} })
	appendN(t, ps[0], 1)
	ds, err := ps[0].Lease(1, time.Minute, 1<<20)
	if err != nil || len(ds) != 1 {
		t.Fatalf("leased %d: %v", len(ds), err)
	}
	acked := make(chan error, 1)
	go func() {
		acked <- ps[0].Settle([]SettleReq{{Offset: ds[0].Record.Offset, Nonce: ds[0].Nonce}})[0]
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !waiting.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the ack never proposed its settle")
		}
		time.Sleep(time.Millisecond)
	}
	if err := ps[0].HandOver(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.moveLead(1, 2) // the transfer: the settle proposed from now on is dropped
	close(gate)
	if err := <-acked; err == nil {
		t.Fatal("the ack committed; the interleaving under test did not happen")
	}
	if again := leaseAll(t, ps[1]); len(again) != 0 {
		t.Fatalf("offset %d, leased for a minute and its ack dropped by the handover, was leased again at once by the successor", again[0].Record.Offset)
	}
	if err := ps[1].Settle([]SettleReq{{Offset: ds[0].Record.Offset, Nonce: ds[0].Nonce}})[0]; err != nil {
		t.Fatalf("the holder's ack sent again to the successor: %v", err)
	}
}
