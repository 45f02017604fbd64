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
