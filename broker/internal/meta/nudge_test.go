package meta

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestFollowersLearnACommitAtOnce: with the empty AppendEntries that tell followers the
// commit index an hour apart, a write through a follower is applied there at once (the
// follower waits for that before it answers), and a write through the controller is
// read on a follower after its Sync at once: the controller appends a barrier (a
// nudge), whose AppendEntries carry the commit index. Without the nudges the
// followers waited for CommitTimeout: the writes, the Syncs and the metadata lease
// failed.
func TestFollowersLearnACommitAtOnce(t *testing.T) {
	net := newTestNet(t)
	net.tune = func(cfg *raft.Config) { cfg.CommitTimeout = time.Hour }
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	ctl := controllerOf(t, ss...)
	via := followerOf(ctl, ss...)
	for i, name := range []string{"through-a-follower", "again"} {
		if _, err := via.CreateTopic(Topic{Name: name, TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
			t.Fatalf("create %d through a follower: %v", i, err)
		}
		if _, ok := via.Topic(name); !ok {
			t.Fatalf("the follower answered the create of %s but does not know it", name)
		}
	}
	if _, err := ctl.CreateTopic(Topic{Name: "through-the-controller", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if s == ctl {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.Sync(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: Sync after a write through the controller: %v", s.NodeID(), err)
		}
		if _, ok := s.Topic("through-the-controller"); !ok {
			t.Fatalf("%s synced but does not know the topic made through the controller", s.NodeID())
		}
	}
	if ctl.nudged.Load() == 0 {
		t.Fatal("the controller appended no barrier for the followers")
	}
	waitReady(t, ss...) // the metadata lease held
}
