package meta

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// openKeepingNoLog opens node id like testNet.open, with Raft keeping no log behind
// its snapshots (so a follower that was away needs one) and no liveness judgement
// within the test (no status change writes a command meanwhile).
func openKeepingNoLog(t *testing.T, net *testNet, dir, id string, addr raft.ServerAddress, c Cluster) *Store {
	t.Helper()
	c = testCluster(c)
	c.SuspectAfter, c.DeadAfter = 10*time.Minute, 10*time.Minute
	c.Transport, c.Forwarder, c.HTTPAddr = net.transport(addr), net, "http-"+string(addr)
	s, err := Open(Options{Dir: dir, NodeID: id, Cluster: c, ApplyTimeout: 10 * time.Second, tuneRaft: func(cfg *raft.Config) {
		cfg.TrailingLogs = 0
		cfg.SnapshotInterval, cfg.SnapshotThreshold = time.Hour, 1<<30
	}})
	if err != nil {
		t.Fatal(err)
	}
	net.mu.Lock()
	net.stores[addr] = s
	net.mu.Unlock()
	return s
}

// TestSyncAfterAnInstalledSnapshot: a node that was away while the controller compacted
// its log catches up by an installed snapshot. When the snapshot's last entries carry
// no command (here a barrier; a new controller's no-op alike), those entries are in the
// node's state but never in its log, so Sync, which waited for Raft to have applied
// through the controller's last index and then read each entry after the state's last
// command from the log, waited for ever for entries it could not read: every Sync on
// that node (a lookup of an unknown topic, a metadata write's check of rights, each step
// of a move) failed 503 until some later command applied.
func TestSyncAfterAnInstalledSnapshot(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	var peers []Peer
	for i := range dirs {
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i+1), Addr: raft.ServerAddress(fmt.Sprintf("addr%d", i+1))})
	}
	ss := make([]*Store, len(dirs))
	for i, p := range peers {
		ss[i] = openKeepingNoLog(t, net, dirs[i], p.ID, p.Addr, Cluster{Peers: peers})
	}
	waitReady(t, ss...)
	eventually(t, "the highest cluster version", func() error {
		if l := leaderOf(ss...); l == nil || l.ClusterVersion() != VersionMax {
			return errors.New("not yet")
		}
		return nil
	})
	// Started again from their directories, the nodes run no bootstrap or join (a join
	// still retrying writes its member record again: a command).
	net.closeAll()
	for i, p := range peers {
		ss[i] = openKeepingNoLog(t, net, dirs[i], p.ID, p.Addr, Cluster{})
	}
	waitReady(t, ss...)
	var ctl *Store
	eventually(t, "a controller with every member alive at the highest version", func() error {
		if ctl = leaderOf(ss...); ctl == nil {
			return errors.New("no controller")
		}
		if v := ctl.ClusterVersion(); v != VersionMax {
			return fmt.Errorf("cluster version %d", v)
		}
		for _, m := range ctl.Members() {
			if m.Status != StatusAlive {
				return fmt.Errorf("%+v", m)
			}
		}
		return nil
	})
	away := -1
	for i, s := range ss {
		if s != ctl {
			away = i
		}
	}
	net.close(ss[away])

	if _, err := ctl.CreateTopic(Topic{Name: "while-away", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := ctl.raft.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if s != ss[away] {
			if err := s.raft.Snapshot().Error(); err != nil {
				t.Fatalf("snapshot on %s: %v", s.NodeID(), err)
			}
		}
	}
	last := ctl.raft.LastIndex()
	if a := ctl.AppliedIndex(); a >= last {
		t.Fatalf("the controller's last command is at %d, its last entry at %d: the log does not end in an entry without a command", a, last)
	}

	back := openKeepingNoLog(t, net, dirs[away], peers[away].ID, peers[away].Addr, Cluster{})
	eventually(t, "the node back has the topic made while it was away", func() error {
		if _, ok := back.Topic("while-away"); !ok {
			return errors.New("not yet")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := back.Sync(ctx); err != nil {
		t.Fatalf("Sync on the node restored from a snapshot: %v (its last command %d, Raft applied %d, the controller's last index %d, no command since)",
			err, back.AppliedIndex(), back.raft.AppliedIndex(), ctl.raft.LastIndex())
	}
	// Entries written meanwhile must carry no command, or the test proves nothing (a
	// command after the snapshot lets the old code through).
	for i := last + 1; i <= ctl.raft.LastIndex(); i++ {
		var l raft.Log
		if err := ctl.bolt.GetLog(i, &l); err == nil && l.Type == raft.LogCommand {
			t.Fatalf("entry %d written meanwhile is a command: %s", i, l.Data)
		} else if err == nil {
			t.Logf("entry %d written meanwhile: %v", i, l.Type)
		}
	}
}
