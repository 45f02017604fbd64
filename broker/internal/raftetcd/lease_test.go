package raftetcd

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// openEverywhere opens group g with voters on every node of ns.
func openEverywhere(t *testing.T, ns []*testNode, g string, voters []uint64) {
	t.Helper()
	for _, n := range ns {
		if err := n.host.OpenGroup(g, GroupConfig{Voters: voters, Dir: filepath.Join(n.opts.Dir, g)}); err != nil {
			t.Fatal(err)
		}
	}
}

// leaseGroup opens group g on every node of a fresh cluster (no quiescing, so the
// leader keeps speaking) and returns the nodes, the leader and its followers.
func leaseGroup(t *testing.T, g string) (ns []*testNode, lead *testNode, followers []*testNode) {
	t.Helper()
	ns = startClusterWith(t, 0, func(o *Options) { o.NoQuiesce = true })
	openEverywhere(t, ns, g, []uint64{1, 2, 3})
	lead = namedLeader(t, ns, g)
	propose(t, lead, g)
	for _, n := range ns {
		if n != lead {
			followers = append(followers, n)
		}
	}
	return ns, lead, followers
}

// namedLeader waits for a leader of g that every node of ns names, and returns it.
func namedLeader(t *testing.T, ns []*testNode, g string) *testNode {
	t.Helper()
	var lead *testNode
	poll(t, 20*time.Second, "a leader every node names", func() bool {
		lead = nil
		for _, n := range ns {
			if info, _ := n.host.Info(g); info.Leader {
				lead = n
			}
		}
		if lead == nil {
			return false
		}
		for _, n := range ns {
			if info, _ := n.host.Info(g); info.Lead != lead.id {
				return false
			}
		}
		return true
	})
	return lead
}

// forcedVote is the vote request of a forced campaign (a liveness-driven takeover or
// a handed leadership) by from at term, with a log as long as to's.
func forcedVote(t *testing.T, from, to *testNode, g string, term uint64) raftpb.Message {
	t.Helper()
	gr := to.host.group(g)
	gr.mu.Lock()
	last, _ := gr.st.LastIndex()
	lt, _ := gr.st.Term(last)
	gr.mu.Unlock()
	return raftpb.Message{Type: raftpb.MsgVote, From: from.id, To: to.id, Term: term, Index: last, LogTerm: lt,
		Context: []byte("CampaignTransfer")}
}

// TestAFollowerThatHearsItsLeaderHoldsItsVote: a forced campaign by a replica that
// cannot hear the leader (its liveness found the leader dead) is not granted by one
// that still hears it, so the leader's lease stays true; the leader refuses such a vote
// too while its lease runs. Before, every voter granted a forced vote at once.
func TestAFollowerThatHearsItsLeaderHoldsItsVote(t *testing.T) {
	t.Parallel()
	const g = "hold"
	_, lead, fs := leaseGroup(t, g)
	if err := lead.host.ConfirmLeader(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	if !lead.host.LeaseHeld(g) {
		t.Fatal("no lease after a read index confirmed the leader")
	}
	voter, cand := fs[0], fs[1]
	info, _ := voter.host.Info(g)
	voter.host.group(g).step(0, forcedVote(t, cand, voter, g, info.Term+1))
	lead.host.group(g).step(0, forcedVote(t, cand, lead, g, info.Term+1))
	for _, n := range []*testNode{voter, lead} {
		if got, _ := n.host.Info(g); got.Term != info.Term || got.Lead != lead.id {
			t.Fatalf("node %d took a forced vote while holding: term %d → %d, lead %d", n.id, info.Term, got.Term, got.Lead)
		}
	}
	gr := voter.host.group(g)
	gr.mu.Lock()
	held := gr.lease.held != nil
	gr.mu.Unlock()
	if !held {
		t.Fatal("the refused vote request was not kept for the hold's end")
	}
	// The leader speaks on, so the hold does not end: a hold longer than a lease.
	time.Sleep(time.Duration(voter.host.holdFor()) + 200*time.Millisecond) // the span under test, not a wait for a condition
	if got, _ := voter.host.Info(g); got.Lead != lead.id {
		t.Fatalf("the voter left its speaking leader %d for %d", lead.id, got.Lead)
	}
}

// TestAHeldVoteIsGrantedWhenTheLeaderFallsSilent: once the leader is gone, the vote
// held is stepped when the hold ends: a failover is delayed by the hold at most.
func TestAHeldVoteIsGrantedWhenTheLeaderFallsSilent(t *testing.T) {
	t.Parallel()
	const g = "silent"
	_, lead, fs := leaseGroup(t, g)
	voter, cand := fs[0], fs[1]
	info, _ := voter.host.Info(g)
	m := forcedVote(t, cand, voter, g, info.Term+1)
	voter.host.group(g).step(0, m)
	if got, _ := voter.host.Info(g); got.Term != info.Term {
		t.Fatalf("granted a forced vote while its leader spoke: term %d → %d", info.Term, got.Term)
	}
	lead.stop()
	start := time.Now()
	poll(t, 10*time.Second, "a leader among the survivors", func() bool {
		a, _ := voter.host.Info(g)
		b, _ := cand.host.Info(g)
		return a.Lead != 0 && a.Lead != lead.id && a.Lead == b.Lead
	})
	t.Logf("elected %v after the leader stopped", time.Since(start).Round(10*time.Millisecond))
}

// TestALeaseLapsesWithoutRenewal: a lease ends E after the read that proved it; asking
// whether it is held renews it in the background.
func TestALeaseLapsesWithoutRenewal(t *testing.T) {
	t.Parallel()
	const g = "lapse"
	_, lead, _ := leaseGroup(t, g)
	if err := lead.host.ConfirmLeader(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	gr := lead.host.group(g)
	gr.mu.Lock()
	until, e := gr.lease.until, lead.host.leaseFor()
	gr.mu.Unlock()
	if left := until - bootNanos(); left <= 0 || left > e {
		t.Fatalf("lease left %v after a confirmation, want in (0, %v]", time.Duration(left), time.Duration(e))
	}
	// Past its end with nobody asking, it is not held; asking renews it.
	time.Sleep(time.Duration(until-bootNanos()) + 10*time.Millisecond) // the span under test
	gr.mu.Lock()
	renewed := gr.lease.until != until
	gr.mu.Unlock()
	if renewed {
		t.Fatal("the lease was renewed although nobody asked for it")
	}
	if lead.host.LeaseHeld(g) {
		t.Fatal("a lease past its end counted as held")
	}
	poll(t, 5*time.Second, "the background renewal", func() bool { return lead.host.LeaseHeld(g) })
}

// TestAHandoverEndsTheLeaseAndTheHold: TransferLeader gives up the lease for the rest
// of the term and tells the followers, so the transferee is elected at once though
// every follower heard the leader a moment before.
func TestAHandoverEndsTheLeaseAndTheHold(t *testing.T) {
	t.Parallel()
	const g = "handover"
	_, lead, fs := leaseGroup(t, g)
	if err := lead.host.ConfirmLeader(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	to := fs[0]
	lead.host.TransferLeader(g, to.id)
	if lead.host.LeaseHeld(g) {
		t.Fatal("a lease held after the handover began")
	}
	// The flagged heartbeat tells every follower, the one not needed for the
	// election too (with five replicas it would be), that it may vote.
	other := fs[1]
	poll(t, 5*time.Second, "the other follower released from its hold", func() bool {
		gr := other.host.group(g)
		gr.mu.Lock()
		defer gr.mu.Unlock()
		return gr.lease.released != 0
	})
	start := time.Now()
	poll(t, 5*time.Second, "the transferee leads", func() bool {
		info, _ := to.host.Info(g)
		return info.Leader
	})
	if d := time.Since(start); d > time.Duration(lead.host.holdFor()) {
		t.Fatalf("the handover took %v, more than a hold: the followers held their votes", d)
	}
}

// TestADeferredTakeoverOfALiveLeaderIsDropped: a forced campaign deferred by the hold
// is dropped once the leader is heard again, even after the group quiesced (the hold's
// timer fired then and forced an election against the healthy leader).
func TestADeferredTakeoverOfALiveLeaderIsDropped(t *testing.T) {
	t.Parallel()
	const g = "deferred"
	ns := startCluster(t, 0) // groups quiesce
	openEverywhere(t, ns, g, []uint64{1, 2, 3})
	var lead *testNode
	poll(t, 20*time.Second, "a leader", func() bool {
		for _, n := range ns {
			if info, _ := n.host.Info(g); info.Leader {
				lead = n
				return true
			}
		}
		return false
	})
	propose(t, lead, g)
	var designated *testNode
	for _, n := range ns {
		if n != lead && (designated == nil || n.id < designated.id) {
			designated = n
		}
	}
	info, _ := designated.host.Info(g)
	gr := designated.host.group(g)
	gr.leaderDown(lead.id) // as if its liveness had found the leader dead
	gr.mu.Lock()
	deferred := gr.lease.forceFrom == lead.id
	gr.mu.Unlock()
	if !deferred {
		t.Fatal("the takeover of a leader heard a moment ago was not deferred")
	}
	propose(t, lead, g) // the leader speaks again, then the group quiesces
	poll(t, 10*time.Second, "the group quiesced", func() bool {
		return allQuiesced(ns, 0) && func() bool {
			i, _ := designated.host.Info(g)
			return i.Quiesced
		}()
	})
	time.Sleep(2*time.Duration(designated.host.holdFor()) + 200*time.Millisecond) // past the hold's end: the span under test
	if got, _ := designated.host.Info(g); got.Term != info.Term || got.Lead != lead.id {
		t.Fatalf("a deferred takeover of a live leader ran: term %d → %d, lead %d → %d", info.Term, got.Term, lead.id, got.Lead)
	}
}

// TestAHandoverWithFiveReplicasIsQuick: with five replicas a handed leadership needs
// a third vote besides the transferee's and the old leader's; the handover flag frees
// the followers that heard the leader a moment before, so the transfer does not wait
// for their hold (or fail and leave the old leader in place).
func TestAHandoverWithFiveReplicasIsQuick(t *testing.T) {
	t.Parallel()
	const g = "five"
	ns := startNodes(t, 5, 0, func(o *Options) { o.NoQuiesce = true }, func(int) {})
	openEverywhere(t, ns, g, []uint64{1, 2, 3, 4, 5})
	lead := namedLeader(t, ns, g)
	propose(t, lead, g)
	if err := lead.host.ConfirmLeader(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	var to *testNode
	for _, n := range ns {
		if n != lead {
			to = n
			break
		}
	}
	start := time.Now()
	lead.host.TransferLeader(g, to.id)
	poll(t, 10*time.Second, "the transferee leads", func() bool {
		info, _ := to.host.Info(g)
		return info.Leader
	})
	if d := time.Since(start); d > time.Duration(lead.host.holdFor())/2 {
		t.Fatalf("the handover took %v: the followers held their votes", d)
	}
}

// TestAFollowerThatCountsItsLeaderDeadDoesNotQuiesce: a follower whose liveness counts
// its leader dead (its takeover deferred by the hold, then dropped because the leader
// still spoke) stays awake when the leader quiesces the group: a quiesced follower
// neither ticks nor answers pre-votes, so the leader's real death would elect nobody.
func TestAFollowerThatCountsItsLeaderDeadDoesNotQuiesce(t *testing.T) {
	t.Parallel()
	const g = "awake"
	ns := startCluster(t, 0) // groups quiesce
	openEverywhere(t, ns, g, []uint64{1, 2, 3})
	lead := namedLeader(t, ns, g)
	var doubting, trusting *testNode
	for _, n := range ns {
		switch {
		case n == lead:
		case doubting == nil:
			doubting = n
		default:
			trusting = n
		}
	}
	// The ticker rewrites alive only when its own view changes, and that view stays
	// "live": the doubting node counts the leader dead from here on.
	p := doubting.host.peer(lead.id)
	p.alive.Store(false)
	defer p.alive.Store(true)
	propose(t, lead, g) // wakes the group; it quiesces again once idle
	poll(t, 10*time.Second, "the leader and the trusting follower quiesced", func() bool {
		l, _ := lead.host.Info(g)
		f, _ := trusting.host.Info(g)
		return l.Quiesced && f.Quiesced
	})
	if info, _ := doubting.host.Info(g); info.Quiesced {
		t.Fatal("a follower that counts its leader dead quiesced")
	}
}

// TestLeaseValidCountsNoConsume: LeaseValid answers as LeaseHeld does, but a leader
// asking it before it answers its counters serves no consume under the lease, so
// narad_replication_lease_consumes_total (Stats.LeaseServed) does not move.
func TestLeaseValidCountsNoConsume(t *testing.T) {
	t.Parallel()
	const g = "valid"
	_, lead, fs := leaseGroup(t, g)
	if err := lead.host.ConfirmLeader(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	before := lead.host.Stats().LeaseServed
	if !lead.host.LeaseValid(g) {
		t.Fatal("LeaseValid is false after a read index confirmed the leader")
	}
	if fs[0].host.LeaseValid(g) {
		t.Fatal("LeaseValid is true on a follower")
	}
	if got := lead.host.Stats().LeaseServed; got != before {
		t.Fatalf("LeaseValid counted %d consumes served under the lease", got-before)
	}
	if !lead.host.LeaseHeld(g) || lead.host.Stats().LeaseServed != before+1 {
		t.Fatalf("LeaseHeld counted %d consumes, want 1", lead.host.Stats().LeaseServed-before)
	}
}

// TestALeaseCountsFromItsReadsAsk: a lease ends E after the read index that proved it
// was asked, not after raft answered it. The followers heard the leader after the ask
// (the read's heartbeats go out after it), so their holds, longer than E, outlast a
// lease counted so; counted from the answer, a late answer (a leader paused between
// its followers' acknowledgements and its Ready loop, a slow disk, a loaded machine)
// ran the lease past the end of their holds, and another leader could be elected while
// this one still served under it. A mutation review (7 December) found no test that
// noticed a lease counted from the answer.
func TestALeaseCountsFromItsReadsAsk(t *testing.T) {
	t.Parallel()
	const g = "fromask"
	_, lead, _ := leaseGroup(t, g)
	gr := lead.host.group(g)
	// The read is asked as ConfirmLeader and LeaseHeld ask theirs; nothing else asks
	// one in this group (no partition asks whether it holds a lease).
	gr.mu.Lock()
	id := gr.askReadLocked()
	asked, term := gr.lease.reads[id].at, gr.lease.reads[id].term
	gr.mu.Unlock()
	gr.signal()
	var until int64
	poll(t, 10*time.Second, "the lease the read proves", func() bool {
		gr.mu.Lock()
		defer gr.mu.Unlock()
		until = gr.lease.until
		return gr.lease.term == term && until != 0
	})
	if want := asked + lead.host.leaseFor(); until != want {
		t.Fatalf("the lease ends %v after E from its read's ask, want at E from it", time.Duration(until-want))
	}
}

// TestALeaderThatLeadsAgainIsToldAgain: a step down takes the leadership back from the
// application (OnRole(false)) and from the group (the lease and ConfirmLeader ask
// whether it leads), so a node that leads again later is told again once it applied
// everything committed before (OnRole(true)). A step down that left the group's mark
// of it set never told the node it led again: it answered not_leader as a raft leader
// for ever, and its lease and confirmations stood on the mark of the leadership it
// had lost. A mutation review (7 December) found no test that made a leader lead again.
func TestALeaderThatLeadsAgainIsToldAgain(t *testing.T) {
	t.Parallel()
	const g = "again"
	ns := startClusterWith(t, 0, func(o *Options) { o.NoQuiesce = true })
	var mu sync.Mutex
	roles := map[uint64][]bool{}
	for _, n := range ns {
		id := n.id
		cfg := GroupConfig{Voters: []uint64{1, 2, 3}, Dir: filepath.Join(n.opts.Dir, g), OnRole: func(lead bool, _ uint64) {
			mu.Lock()
			roles[id] = append(roles[id], lead)
			mu.Unlock()
		}}
		if err := n.host.OpenGroup(g, cfg); err != nil {
			t.Fatal(err)
		}
	}
	told := func(n *testNode, want []bool) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Equal(roles[n.id], want)
		}
	}
	lead := namedLeader(t, ns, g)
	propose(t, lead, g)
	poll(t, 10*time.Second, "the leader told it leads", told(lead, []bool{true}))
	other := ns[0]
	if other == lead {
		other = ns[1]
	}
	lead.host.TransferLeader(g, other.id)
	poll(t, 10*time.Second, "the leadership moved and the old leader told it stopped", func() bool {
		info, _ := other.host.Info(g)
		return info.Leader && told(lead, []bool{true, false})()
	})
	poll(t, 10*time.Second, "the new leader told it leads", told(other, []bool{true}))
	other.host.TransferLeader(g, lead.id)
	poll(t, 10*time.Second, "the first leader told it leads again", told(lead, []bool{true, false, true}))
	if err := lead.host.ConfirmLeader(context.Background(), g); err != nil {
		t.Fatalf("the leader that leads again cannot confirm it: %v", err)
	}
}

// TestAConfigurationChangeEndsTheLease: a lease proved under one configuration ends
// when the leader appends a change of it: the quorum that held its votes for the
// lease may not be a quorum of the new configuration (voters added, which never held
// theirs), so a leader could be elected while the old lease ran. A later read of the
// new configuration proves a new lease. A mutation review (7 December) found no test
// of the end; the tests of the configuration's epoch cover only reads asked across a
// change.
func TestAConfigurationChangeEndsTheLease(t *testing.T) {
	t.Parallel()
	const g = "confend"
	_, lead, _ := leaseGroup(t, g)
	gr := lead.host.group(g)
	gr.mu.Lock()
	epoch := gr.lease.confEpoch
	gr.mu.Unlock()
	if err := lead.host.ConfirmLeader(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	gr.mu.Lock()
	until := gr.lease.until
	gr.mu.Unlock()
	if until == 0 {
		t.Fatal("no lease after a read index confirmed the leader")
	}
	// A learner with no address: a change of the configuration all the same.
	if err := lead.host.ChangeConf(g, ConfChange{AddLearners: []uint64{9}}); err != nil {
		t.Fatal(err)
	}
	var left int64
	poll(t, 10*time.Second, "the change appended on the leader", func() bool {
		gr.mu.Lock()
		defer gr.mu.Unlock()
		left = gr.lease.until // nothing asks a read meanwhile: no new lease
		return gr.lease.confEpoch != epoch
	})
	if left != 0 {
		t.Fatalf("a lease proved under the old configuration still ran (until %d, was %d) after a change of it", left, until)
	}
	if lead.host.LeaseHeld(g) {
		t.Fatal("a lease proved under the old configuration is held after a change of it")
	}
}
