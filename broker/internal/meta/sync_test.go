package meta

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestSyncSeesAWriteMadeThroughAnotherNode: a topic created through the controller is
// not yet in a slow follower's replica, and after Sync it is. Concurrent Syncs all
// see it. Without Sync (or with one that answered before catching up) the follower
// would tell a client its topic does not exist.
func TestSyncSeesAWriteMadeThroughAnotherNode(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	leader := leaderOf(ss...)
	var follower *Store
	for _, s := range ss {
		if s != leader {
			follower = s
		}
	}
	slow := func() { time.Sleep(200 * time.Millisecond) }
	follower.fsm.beforeApply.Store(&slow)
	if _, err := leader.CreateTopic(Topic{Name: "made-elsewhere", TopicConfig: TopicConfig{Partitions: 1, RetentionMs: 1000}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := follower.Topic("made-elsewhere"); ok {
		t.Fatalf("the slow follower applied the create at once; the test cannot tell Sync did anything")
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := follower.Sync(ctx); err != nil {
				errs <- err.Error()
				return
			}
			if _, ok := follower.Topic("made-elsewhere"); !ok {
				errs <- "Sync returned before the follower applied the create"
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	// On the controller, Sync answers too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := leader.Sync(ctx); err != nil {
		t.Fatalf("Sync on the controller: %v", err)
	}
}

// TestSyncWhenTheLogEndsInAnEntryWithoutACommand: the controller's last log index can
// be an entry the state machine never sees (the no-op a new controller writes when it
// takes over, a barrier, a configuration change). Sync must still return once every
// command up to that index is applied, not wait for the next command to come along
// (in a quiet cluster, right after the controller was killed, none came for minutes
// and moves stalled on it).
func TestSyncWhenTheLogEndsInAnEntryWithoutACommand(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	leader := leaderOf(ss...)
	if _, err := leader.CreateTopic(Topic{Name: "before", TopicConfig: TopicConfig{Partitions: 1, RetentionMs: 1000}}); err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, leader)
	if err := leader.raft.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	for _, s := range append([]*Store{leader}, ss...) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := s.Sync(ctx)
		cancel()
		if err != nil {
			t.Fatalf("Sync on %s with the log ending in a barrier: %v", s.NodeID(), err)
		}
		if _, ok := s.Topic("before"); !ok {
			t.Fatalf("Sync on %s returned before the create was applied", s.NodeID())
		}
	}
}

// waitQuiet waits for the cluster to go quiet (its first heartbeats and version
// commits are commands): the controller's log stays as it is for 2 s. Then nothing but
// the test writes.
func waitQuiet(t *testing.T, ctl *Store) {
	t.Helper()
	last, since := ctl.raft.LastIndex(), time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Since(since) < 2*time.Second; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the control plane never went quiet for 2 s")
		}
		if l := ctl.raft.LastIndex(); l != last {
			last, since = l, time.Now()
		}
	}
}

// TestASyncWaitingBehindAHungOneMovesOn: a Sync that arrives while another (here the
// lease renewal) hangs on a controller that died waits behind it, then for the next
// controller, and is answered by it. Found in review: it ran a newer call at once,
// found no controller yet (Raft reports the lost leader first) and failed.
func TestASyncWaitingBehindAHungOneMovesOn(t *testing.T) {
	net, old, follower, hung, cut := deadController(t, 10*time.Second, kindSyncIndex)
	<-hung // the renewal (every 100 ms here) owns the hung call
	other := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		other <- follower.Sync(ctx)
	}()
	time.Sleep(50 * time.Millisecond) // it waits behind the renewal's call
	// The controller dies, and the two others cannot reach each other for a moment:
	// the follower knows no controller for that long.
	var third *Store
	net.mu.Lock()
	for _, s := range net.stores {
		if s != old && s != follower {
			third = s
		}
	}
	net.trans[follower.addr].Disconnect(third.addr)
	net.trans[third.addr].Disconnect(follower.addr)
	net.mu.Unlock()
	cut()
	eventually(t, "the follower to know no controller", func() error {
		if addr, _ := follower.raft.LeaderWithID(); addr != "" {
			return fmt.Errorf("it knows %q", addr)
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	net.mu.Lock()
	net.trans[follower.addr].Connect(third.addr, net.trans[third.addr])
	net.trans[third.addr].Connect(follower.addr, net.trans[follower.addr])
	net.mu.Unlock()
	select {
	case err := <-other:
		if err != nil {
			t.Fatalf("a Sync with 10 s to go, waiting behind a hung one when the controller died: %v", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the Sync has not returned 8 s after the controller died")
	}
}

// TestASyncWithoutADeadlineEndsWhenNoControllerComes: a Sync whose caller set no
// deadline (an admin request's context) gives up within a lease once no controller
// can be elected, instead of waiting for one for as long as the quorum is lost.
func TestASyncWithoutADeadlineEndsWhenNoControllerComes(t *testing.T) {
	// A 2 s lease: the wait for a controller ends within it.
	net, _, follower, hung, _ := deadController(t, 2*time.Second, kindSyncIndex)
	done := make(chan error, 1)
	go func() { done <- follower.Sync(context.Background()) }()
	<-hung
	// Cut every node from every other: no quorum anywhere.
	net.mu.Lock()
	for a, tr := range net.trans {
		for b := range net.trans {
			if a != b {
				tr.Disconnect(b)
			}
		}
	}
	net.mu.Unlock()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a Sync succeeded without a quorum")
		}
		t.Logf("returned: %v", err)
	case <-time.After(follower.Lease() + 5*time.Second):
		t.Fatalf("a Sync without a deadline still waits %v after the quorum was lost", follower.Lease()+5*time.Second)
	}
}

// TestASyncDoesNotWaitForADeposedControllersTail: a controller may answer a Sync with
// an index it has not committed (its log's last entry); if it dies then, the next term
// cuts that entry, and a follower waiting to apply it would wait until its caller's
// bound. A change of leader ends that wait, and the Sync asks the next controller.
func TestASyncDoesNotWaitForADeposedControllersTail(t *testing.T) {
	net, old, follower, _, cut := deadController(t, 10*time.Second, kindSyncIndex)
	net.mu.Lock()
	hang := net.hang
	net.hang = nil
	answered := make(chan struct{}, 1)
	net.rewrite = func(kind string, addr raft.ServerAddress, b []byte) []byte {
		if kind != kindSyncIndex || addr != old.addr {
			return b
		}
		var r fwdResponse
		if err := json.Unmarshal(b, &r); err != nil {
			return b
		}
		r.Index += 1000 // as if its last entries were not committed yet (and far ahead of what the next controller writes)
		out, _ := json.Marshal(r)
		select {
		case answered <- struct{}{}:
		default:
		}
		return out
	}
	net.mu.Unlock()
	<-answered // a renewal waits to apply an index that never comes
	net.mu.Lock()
	net.rewrite = nil
	net.hang = hang
	net.mu.Unlock()
	cut()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := follower.Sync(ctx); err != nil {
		t.Fatalf("Sync after the controller died: %v", err)
	}
	// The renewal waiting for the phantom index held every Sync behind it for its
	// bound (half the lease, 5 s); the next controller answers within moments.
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Sync took %v after the controller died", took)
	} else {
		t.Logf("answered in %v", took.Round(time.Millisecond))
	}
}
