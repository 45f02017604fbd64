package meta

import (
	"context"
	"sync"
	"testing"
	"time"
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
