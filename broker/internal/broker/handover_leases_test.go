package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestAMovedLeadershipCarriesItsLeases: a leadership moved by this node, by its own
// reconcile (handOverTo: a rebalance chose another leader, a move, a leader removed
// from its group) or before it stops (handOverLeadership: SIGTERM, a rolling
// restart), commits the live leases before the transfer, so the successor honours
// their receipt handles: the message is not delivered again, and the ack of it leased
// before answers 204. A mutation review (7 December) found that either path
// transferring without partition.HandOver passed every test of this package (e2e
// tests of a rolling restart and of a rebalance noticed).
func TestAMovedLeadershipCarriesItsLeases(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"move", "stop"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			movedLeadershipCarriesLeases(t, how)
		})
	}
}

func movedLeadershipCarriesLeases(t *testing.T, how string) {
	bs := startReplCluster(t, 3, false)
	name := "r3moved" + how
	d, lead := replLeasedOne(t, bs, name)
	lt, err := bs[lead].lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	info, ok := bs[lead].repl.host.Info(lt.gid(0))
	if !ok || !info.Leader {
		t.Fatalf("node %s no longer leads the partition it leased from", bs[lead].opts.NodeID)
	}
	switch how {
	case "move":
		target := (lead + 1) % 3
		bs[lead].handOverTo(lt, 0, info, []uint64{raftID(bs[target].meta.ServerID())}, "a test moves it")
	case "stop":
		bs[lead].handOverLeadership(30 * time.Second)
	}
	next := -1
	waitOrFail(t, 30*time.Second, "another node leads", func() error {
		if next = leaderIndex(bs, name, 0); next < 0 || next == lead {
			return errors.New("the leadership has not moved")
		}
		return nil
	})
	// The message stays leased on the successor: a consume gets nothing.
	ctx := context.Background()
	ds, err := bs[next].Consume(ctx, name, 10, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 0 {
		t.Fatalf("the successor delivered %d messages again (attempt %d) that the moved leader had leased", len(ds), ds[0].Attempt)
	}
	waitOrFail(t, 30*time.Second, "the ack of the message leased before the move", func() error {
		err := bs[next].Ack(name, []AckReq{{Handle: d.Handle}})[0]
		if errors.Is(err, ErrLeaseLost) {
			t.Fatalf("the ack of a message leased before the move answered %v: the successor did not take the lease", err)
		}
		if err != nil {
			return fmt.Errorf("the ack answered %w", err)
		}
		return nil
	})
}
