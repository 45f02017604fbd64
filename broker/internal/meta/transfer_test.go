package meta

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestWriteDuringAControllerHandoverIsSentAgain: while the controller hands over (a
// decommissioned or halted controller does), Raft refuses every new entry with
// ErrLeadershipTransferInProgress before appending it, so the write certainly did not
// happen and is sent again (to whichever node leads once the handover ends), as after
// ErrNotLeader, instead of failing as a write of unknown outcome.
func TestWriteDuringAControllerHandoverIsSentAgain(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	var ctl, target *Store
	eventually(t, "a controller", func() error {
		if ctl = leaderOf(ss...); ctl == nil {
			return errors.New("none")
		}
		return nil
	})
	var via *Store // a follower that forwards its writes to the controller
	for _, s := range ss {
		if s != ctl {
			via, target = target, s
		}
	}
	// The target is stopped: requests to it wait out the transport's timeout, so the
	// handover to it lasts until it gives up (an election timeout).
	net.close(target)
	transfer := ctl.raft.LeadershipTransferToServer(raft.ServerID(target.ServerID()), target.addr)
	done := make(chan error, 1)
	go func() { done <- transfer.Error() }()
	for i := 0; ; i++ {
		select {
		case err := <-done:
			t.Logf("handover ended after %d writes: %v", i, err)
			if i == 0 {
				t.Fatal("the handover ended before any write was tried")
			}
			return
		default:
		}
		w := []*Store{ctl, via}[i%2]
		if _, err := w.CreateTopic(Topic{Name: fmt.Sprintf("during-%d", i), TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
			t.Fatalf("write %d through %s during the handover: %v", i, w.NodeID(), err)
		}
		time.Sleep(5 * time.Millisecond) // paces the writes over the handover; no condition waited for
	}
}
