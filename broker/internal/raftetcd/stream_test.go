package raftetcd

import (
	"testing"
	"time"
)

// commitEverywhere proposes one write to every group at its leader and waits until
// every node applied it.
func commitEverywhere(t *testing.T, ns []*testNode, groups, want int) {
	t.Helper()
	for g, n := range leaders(t, ns, groups) {
		propose(t, n, g)
	}
	poll(t, 20*time.Second, "every node applied every write", func() bool {
		for _, n := range ns {
			for g := range groups {
				if n.appliedIn(groupName(g)) != want {
					return false
				}
			}
		}
		return true
	})
}

// Raft frames go as messages on a stream per peer kept open, not as a call each: each
// node opened a stream to each of its two peers (a third or fourth only if a duplicate
// connection was retired under it), and the frames arrived as stream messages.
func TestFramesGoOnKeptMessageStreams(t *testing.T) {
	t.Parallel()
	const groups = 8
	ns := startCluster(t, groups)
	for round := 1; round <= 3; round++ {
		commitEverywhere(t, ns, groups, round)
	}
	var sent, served uint64
	for _, n := range ns {
		st := n.host.Stats()
		if st.StreamsOpened < 2 || st.StreamsOpened > 4 {
			t.Errorf("n%d opened %d message streams, want one to each of its 2 peers", n.id, st.StreamsOpened)
		}
		if st.BatchCalls < 10*st.StreamsOpened {
			t.Errorf("n%d sent %d frames on %d streams: streams are not kept", n.id, st.BatchCalls, st.StreamsOpened)
		}
		sent += st.BatchCalls
		served += n.node.Stats().MessagesServed
	}
	if got := ns[0].node.Stats().RequestsServed; got > sent/2 {
		t.Errorf("n1 served %d calls for %d frames sent in the cluster: frames went as calls", got, sent)
	}
	if served < sent*9/10 {
		t.Errorf("%d frames sent, %d arrived as stream messages: want (nearly) all", sent, served)
	}
}

// A peer that does not take message streams (a node of an older version) gets its
// frames as calls, and replication goes on; once it runs a version that takes them,
// the others open streams to it after their retry wait.
func TestFramesFallBackToCallsForAPeerWithoutStreams(t *testing.T) {
	t.Parallel()
	const groups = 4
	ns := startClusterWith(t, groups, func(o *Options) { o.streamRetry = 500 * time.Millisecond })
	old := ns[2]
	old.stop()
	old.opts.refuseStreams = true
	old.restart(t)
	poll(t, 20*time.Second, "the restarted node hears its peers", func() bool {
		return old.host.Peers()[1].Live && old.host.Peers()[2].Live
	})
	calls0, msgs0 := old.node.Stats().RequestsServed, old.node.Stats().MessagesServed
	commitEverywhere(t, ns, groups, 1)
	commitEverywhere(t, ns, groups, 2)
	if got := old.node.Stats().RequestsServed - calls0; got == 0 {
		t.Errorf("the node without message streams served no calls while its groups committed")
	}
	if got := old.node.Stats().MessagesServed - msgs0; got != 0 {
		t.Errorf("the node without message streams served %d stream messages", got)
	}

	old.stop()
	old.opts.refuseStreams = false // upgraded (its replay applies its log again: counts no longer hold)
	old.restart(t)
	poll(t, 20*time.Second, "stream messages reach the upgraded node", func() bool {
		for g, n := range leaders(t, ns, groups) {
			propose(t, n, g)
		}
		return old.node.Stats().MessagesServed > 0
	})
}
