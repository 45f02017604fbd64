package partition

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// dropWhile is a member whose proposals are dropped while transferring is set, as raft
// drops every proposal of a leader whose leadership transfer has begun: the replica
// still leads until the transfer completes.
type dropWhile struct {
	member
	transferring *atomic.Bool
}

func (m dropWhile) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	if m.transferring.Load() {
		return nil, ErrNotLeader
	}
	return m.member.Propose(ctx, cmd, submitted)
}

// TestReplicaAnAckDuringAHandoverGoesToTheSuccessor: an ack that reaches a leader
// handing its leadership over (its live leases committed for the successor, the
// transfer begun) must go to the successor, which holds the lease. The leader pinned
// the lease and proposed the settle; raft dropped it (the transfer); the settle's
// abort then took the lease out of the old leader's queue, and the ack sent again to
// the node that still led answered 410 lease_lost although the lease ran on at the
// successor, which delivered the message again once it ran out (a chaos run in
// namespaces, seed 2974028836: a rebalance's handover). Extends and nacks were
// already refused as not-leader during a handover; acks now are too, before they pin
// anything.
func TestReplicaAnAckDuringAHandoverGoesToTheSuccessor(t *testing.T) {
	transferring := &atomic.Bool{}
	g, ps := openGroupWith(t, 3, func(m member) Group { return dropWhile{m, transferring} })
	appendN(t, ps[0], 1)
	ds := leaseSettled(t, ps[0], 1)
	if err := ps[0].HandOver(context.Background()); err != nil {
		t.Fatal(err)
	}
	transferring.Store(true) // the transfer has begun; ps[0] leads until it completes
	req := []SettleReq{{Offset: ds[0].Record.Offset, Nonce: ds[0].Nonce}}
	for try := 1; try <= 2; try++ {
		// The node that routes the ack knows ps[0] as the leader: it asks it again.
		if err := ps[0].Settle(req)[0]; !errors.Is(err, ErrNotLeader) {
			t.Fatalf("an ack to the leader handing over (try %d): %v, want not-leader: the successor holds the lease", try, err)
		}
	}
	transferring.Store(false)
	g.moveLead(1, 2)
	if again := leaseAll(t, ps[1]); len(again) != 0 {
		t.Fatalf("the successor leased offset %d again at once, its lease handed over for a minute", again[0].Record.Offset)
	}
	if err := ps[1].Settle(req)[0]; err != nil {
		t.Fatalf("the ack at the successor: %v", err)
	}
}
