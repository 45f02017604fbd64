package raftetcd

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestClockOffsetIsOfTheStampingClock: the peer clock offsets (the metric an operator
// watches for skew) are measured on the clock each node stamps records with
// (Options.WallClock), not on the machine's: a node whose stamping clock kept the
// machine's time of its start while the machine's clock was stepped (a paused and
// resumed virtual machine) stamps records seconds off its peers, and its offset must
// say so. Here node 2's stamping clock runs 5 s ahead of the machine's.
func TestClockOffsetIsOfTheStampingClock(t *testing.T) {
	t.Parallel()
	const ahead = 5 * time.Second
	ns := startClusterWith(t, 1, func(o *Options) {
		if o.ID == 2 {
			o.WallClock = func() int64 { return time.Now().Add(ahead).UnixNano() }
		}
	})
	near := func(d, want time.Duration) bool {
		return d > want-500*time.Millisecond && d < want+500*time.Millisecond
	}
	poll(t, 10*time.Second, "node 1 to measure node 2 5 s ahead and node 3 level", func() bool {
		offs := ns[0].host.ClockOffsets()
		return near(offs[2], ahead) && near(offs[3], 0)
	})
	poll(t, 10*time.Second, "node 2 to measure node 1 5 s behind", func() bool {
		return near(ns[1].host.ClockOffsets()[1], -ahead)
	})
}

// TestPeerStalledFollowsItsLivenessAnswers: a node's liveness answers say whether its
// disk stalls (Options.DiskStalled), and its peers' PeerStalled follows them both ways;
// a node that sets no DiskStalled never counts as stalled.
func TestPeerStalledFollowsItsLivenessAnswers(t *testing.T) {
	t.Parallel()
	var stalled atomic.Bool
	ns := startClusterWith(t, 0, func(o *Options) {
		if o.ID == 3 {
			o.DiskStalled = stalled.Load
		}
	})
	seen := func(want bool) func() bool {
		return func() bool { return ns[0].host.PeerStalled(3) == want && ns[1].host.PeerStalled(3) == want }
	}
	poll(t, 10*time.Second, "nodes 1 and 2 to hear node 3 at all", func() bool {
		return !ns[0].host.PeerSilent(3) && ns[0].host.Peers()[3].Live && ns[1].host.Peers()[3].Live
	})
	if ns[0].host.PeerStalled(3) || ns[2].host.PeerStalled(1) {
		t.Fatal("a peer on a quick disk counted stalled")
	}
	stalled.Store(true)
	poll(t, 10*time.Second, "nodes 1 and 2 to count node 3 stalled", seen(true))
	if ns[2].host.PeerStalled(1) || ns[0].host.PeerStalled(2) {
		t.Fatal("a node with no DiskStalled counted stalled")
	}
	stalled.Store(false)
	poll(t, 10*time.Second, "nodes 1 and 2 to count node 3 quick again", seen(false))
}
