package meta

import (
	"context"
	"errors"
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

// TestSyncsDoNotNudgeEachOther: the barrier a nudge appends is the controller's last
// entry, which followers learn committed only at the next CommitTimeout; a Sync
// answered with it saw a commit index below it and nudged again, each nudge making the
// next, so a follower asking often (here its lease every 100 ms, and a loop of Syncs)
// had the controller append a barrier, an fsync on every node, per Sync for good.
//
// On a machine loaded enough the controller may change while the test runs (make test
// once saw the first controller deposed before its write): the write goes to whichever
// node leads, and each election may add the barrier its own first write needs.
func TestSyncsDoNotNudgeEachOther(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	var ctl *Store
	eventually(t, "a write through a steady controller", func() error {
		ctl = controllerOf(t, ss...)
		waitQuiet(t, ctl)
		_, err := ctl.CreateTopic(Topic{Name: "one-write", TopicConfig: TopicConfig{Partitions: 1}})
		if errors.Is(err, ErrNotLeader) {
			return err // deposed meanwhile: nothing was written
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil
	})
	via := followerOf(ctl, ss...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := via.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	nudged := func() (n uint64) {
		for _, s := range ss {
			n += s.nudged.Load()
		}
		return n
	}
	before, last, term := nudged(), ctl.raft.LastIndex(), ctl.raft.CurrentTerm()
	for range 100 {
		if err := via.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var elections uint64
	for _, s := range ss {
		if now := s.raft.CurrentTerm(); now > term {
			elections = max(elections, now-term)
		}
	}
	if n := nudged() - before; n > 3+elections {
		t.Fatalf("100 Syncs after one write appended %d barriers (log %d → %d, %d elections); a Sync should nudge only while the last write's commit is news", n, last, ctl.raft.LastIndex(), elections)
	}
}
