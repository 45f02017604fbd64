package partition

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/queue"
)

// settleHook is a member that, once, runs *hook when its replica proposes a settle
// (an S command), before the proposal: a test begins a handover there. While
// transferring is set, proposals are dropped (ErrNotLeader), as raft drops every
// proposal of a leader whose leadership transfer has begun.
type settleHook struct {
	member
	hook         *atomic.Pointer[func()]
	transferring *atomic.Bool
}

func (m settleHook) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	if len(cmd) > 0 && cmd[0] == cmdSettle {
		if h := m.hook.Swap(nil); h != nil {
			(*h)()
		}
	}
	if m.transferring.Load() {
		return nil, ErrNotLeader
	}
	return m.member.Propose(ctx, cmd, submitted)
}

// TestReplicaADroppedSettleOfACalledOffHandoverKeepsTheLease: an ack pins its lease
// (BeginSettle) on the leader; before its S command is proposed, a handover reads the
// live leases (the pinned one among them), commits its L and begins the transfer, so
// raft drops the S (not-leader: nothing was done). The transfer does not happen (the
// target could not take it) and the leader calls the handover off and serves on, in
// the same term. The lease was never lapsed, handed back or settled, and the leader
// never changed; the ack sent again (the routing retries it on the same node, or the
// client retries the 503) must settle the message. On the old code the dropped
// settle's AbortSettle handed the message back for redelivery: the ack answers 410
// lease_lost and the message is delivered again to another consumer, in a planned
// change that "redelivers nothing".
func TestReplicaADroppedSettleOfACalledOffHandoverKeepsTheLease(t *testing.T) {
	hook := &atomic.Pointer[func()]{}
	transferring := &atomic.Bool{}
	_, ps := openGroupWith(t, 3, func(m member) Group { return settleHook{m, hook, transferring} })
	appendN(t, ps[0], 1)
	ds := leaseSettled(t, ps[0], 1)
	handover := func() {
		if err := ps[0].HandOver(context.Background()); err != nil {
			t.Errorf("handover: %v", err)
		}
		transferring.Store(true) // the transfer has begun: raft drops proposals
	}
	hook.Store(&handover)
	req := []SettleReq{{Offset: ds[0].Record.Offset, Nonce: ds[0].Nonce}}
	if err := ps[0].Settle(req)[0]; !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the ack whose settle raft dropped answered %v, want not-leader (nothing done, sent on)", err)
	}
	// The transfer did not happen: the leader calls the handover off and serves on.
	transferring.Store(false)
	if err := ps[0].ResumeAfterHandOver(context.Background()); err != nil {
		t.Fatal(err)
	}
	if again := leaseAll(t, ps[0]); len(again) != 0 {
		t.Errorf("the leader delivered offset %d again (attempt %d) while its lease, never lapsed, was held by the consumer whose ack raft dropped",
			again[0].Record.Offset, again[0].Attempt)
	}
	if err := ps[0].Settle(req)[0]; err != nil {
		if errors.Is(err, queue.ErrLeaseLost) {
			t.Fatalf("the ack sent again to the same leader, same term, lease never lapsed, answered 410 lease_lost")
		}
		t.Fatalf("the ack sent again: %v", err)
	}
	if !ps[0].q.IsSettled(ds[0].Record.Offset) {
		t.Fatal("the ack answered 204 and the offset is not settled")
	}
}

// blockSettles is a member whose settle proposals (S commands) each announce
// themselves on entered and then wait for their turn on release: the function sent
// there answers the proposal instead of the group (nil: it goes to the group).
type blockSettles struct {
	member
	entered chan struct{}
	release chan func() (any, error)
}

func (m blockSettles) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	if len(cmd) > 0 && cmd[0] == cmdSettle {
		m.entered <- struct{}{}
		if f := <-m.release; f != nil {
			return f()
		}
	}
	return m.member.Propose(ctx, cmd, submitted)
}

// TestReplicaAStaleSettleAbortLeavesANewerLeaseAlone: an ack's settle on the leader
// of term 1 is proposed and its outcome stays unknown (the commit is not seen within
// replicateTimeout) while this replica loses the leadership and wins it back in term
// 3: its queue starts a new epoch and the message is leased again, to Y, whose ack is
// being settled too. Then the old settle gives up (outcome unknown) and aborts: the
// abort names only the offset, so it took Y's pinned lease, of another epoch, out of
// the queue and made the message ready. It was leased to a third consumer Z while Y's
// settle was still on its way, and Y's ack then answered 204: the message was
// delivered again under a lease no event of the contract ended. A settle gives up
// only the lease it pinned.
func TestReplicaAStaleSettleAbortLeavesANewerLeaseAlone(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan func() (any, error))
	_, ps := openGroupWith(t, 3, func(m member) Group { return blockSettles{m, entered, release} })
	appendN(t, ps[0], 1)
	x := leaseSettled(t, ps[0], 1)
	xDone := make(chan error, 1)
	go func() { xDone <- ps[0].Settle([]SettleReq{{Offset: x[0].Record.Offset, Nonce: x[0].Nonce}})[0] }()
	<-entered // X's lease is pinned, its S proposed

	// The leadership is lost and won back (terms 2 and 3) while X's S is pending.
	ps[0].SetRole(false, 0)
	ps[0].SetRole(true, 3)
	y := leaseSettled(t, ps[0], 1)
	if y[0].Record.Offset != x[0].Record.Offset {
		t.Fatalf("the new leader leased offset %d, want %d again", y[0].Record.Offset, x[0].Record.Offset)
	}
	yDone := make(chan error, 1)
	go func() { yDone <- ps[0].Settle([]SettleReq{{Offset: y[0].Record.Offset, Nonce: y[0].Nonce}})[0] }()
	<-entered // Y's lease is pinned, its S proposed

	// X's proposal gives up: its outcome is unknown.
	release <- func() (any, error) { return nil, context.DeadlineExceeded }
	if err := <-xDone; !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("X's ack answered %v, want outcome unknown", err)
	}
	z, err := ps[0].Lease(1, time.Minute, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	release <- nil // Y's S commits
	yErr := <-yDone
	if len(z) != 0 {
		t.Errorf("offset %d was leased to Z (attempt %d) while Y's lease was pinned by its ack (which answered %v)", z[0].Record.Offset, z[0].Attempt, yErr)
	}
	if yErr != nil {
		t.Fatalf("Y's ack: %v", yErr)
	}
}
