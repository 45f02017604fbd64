package meta

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestWipedNodeRejoinsAsANewServer: a node whose data directory was wiped joins again
// under its node id with a new disk id; the controller removes its old Raft server, so
// the new one never stands in for the history the old one held.
func TestWipedNodeRejoinsAsANewServer(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	ss := startPeers(t, net, dirs)
	if _, err := ss[0].CreateTopic(Topic{Name: "kept", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
		t.Fatal(err)
	}
	victim := ss[2]
	if victim.Leader() {
		victim = ss[1]
	}
	oldSID := victim.ServerID()
	dir := victim.opts.Dir
	net.close(victim)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	s, err := net.open(dir, victim.NodeID(), victim.addr, Cluster{Join: ss[0].addr})
	if err != nil {
		t.Fatal(err)
	}
	if s.ServerID() == oldSID {
		t.Fatalf("a wiped directory kept its server id %s", oldSID)
	}
	waitReady(t, s)
	if _, ok := s.Topic("kept"); !ok {
		t.Fatal("the rejoined node did not receive the metadata")
	}
	waitReplaced(t, oldSID, s, ss...)
}

// waitReplaced waits until the controller among ss and s replaced the Raft server
// oldSID by s's: the old one gone, s a voter and an alive member, three servers.
func waitReplaced(t *testing.T, oldSID string, s *Store, ss ...*Store) {
	t.Helper()
	eventually(t, "the old server removed, the new one a voter and an alive member", func() error {
		l := leaderOf(append([]*Store{s}, ss...)...)
		if l == nil {
			return errors.New("no controller")
		}
		conf := serverIDs(t, l)
		if _, ok := conf[oldSID]; ok || conf[s.ServerID()] != raft.Voter || len(conf) != 3 {
			return fmt.Errorf("configuration %v", conf)
		}
		m, _ := l.fsm.member(s.NodeID())
		if m.ServerID != s.ServerID() || m.Status != StatusAlive {
			return fmt.Errorf("member %+v", m)
		}
		return nil
	})
}

// TestSecondNodeWithALiveNodesIDIsRefused: a node claiming a live member's node id from
// another data directory is not admitted, and says why.
func TestSecondNodeWithALiveNodesIDIsRefused(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	before := serverIDs(t, leaderOf(ss...))
	imp, err := net.open(t.TempDir(), "n2", "addr-impostor", Cluster{Join: ss[0].addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = imp.WaitReady(ctx)
	if !errors.Is(err, ErrNodeIDInUse) || !strings.Contains(err.Error(), "n2") {
		t.Fatalf("impostor: %v, want ErrNodeIDInUse naming n2", err)
	}
	if after := serverIDs(t, leaderOf(ss...)); len(after) != len(before) {
		t.Fatalf("configuration changed: %v -> %v", before, after)
	}
}

// TestNodeIDMismatchIsRefused: a data directory opened with another node id than its
// own is refused, naming both.
func TestNodeIDMismatchIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := Open(Options{Dir: dir, NodeID: "n9"})
	if !errors.Is(err, ErrNodeIDMismatch) || !strings.Contains(err.Error(), `"n1"`) || !strings.Contains(err.Error(), `"n9"`) {
		t.Fatalf("open with another node id: %v, want ErrNodeIDMismatch naming n1 and n9", err)
	}
}

func untar(t *testing.T, path, dst string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dst, filepath.Clean(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestLegacyDataDirOpensAsAClusterOfOne: the metadata of the single-node version
// (server id = node id, in-memory address) opens as a cluster of one with its topics,
// gets a cluster id and a member, its topics a placement on the node, and a node id
// other than its own is refused.
func TestLegacyDataDirOpensAsAClusterOfOne(t *testing.T) {
	root := t.TempDir()
	untar(t, "../../e2e/testdata/legacy-7cfc66e.tar.gz", root)
	b, err := os.ReadFile(filepath.Join(root, "node-id"))
	if err != nil {
		t.Fatal(err)
	}
	node := strings.TrimSpace(string(b))
	dir := filepath.Join(root, "meta")
	if _, err := Open(Options{Dir: dir, NodeID: "someone-else"}); !errors.Is(err, ErrNodeIDMismatch) || !strings.Contains(err.Error(), node) {
		t.Fatalf("legacy directory opened as another node: %v, want ErrNodeIDMismatch naming %s", err, node)
	}
	for round := 0; round < 2; round++ {
		s, err := Open(Options{Dir: dir, NodeID: node})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		waitReady(t, s)
		if ts := s.Topics(); len(ts) < 2 {
			t.Fatalf("round %d: topics %+v, want the legacy directory's", round, ts)
		}
		eventually(t, "cluster id, member and placement", func() error {
			if s.ClusterID() == "" {
				return errors.New("no cluster id")
			}
			if ms := s.Members(); len(ms) != 1 || ms[0].ID != node || ms[0].ServerID != s.ServerID() || ms[0].Status != StatusAlive || !ms[0].Voter {
				return fmt.Errorf("members %+v", ms)
			}
			for _, tp := range s.Topics() {
				if int32(len(tp.Placement)) != tp.Partitions || tp.Placement[0].Leader != node {
					return fmt.Errorf("topic %s placement %+v", tp.Name, tp.Placement)
				}
			}
			return nil
		})
		conf := serverIDs(t, s)
		if len(conf) != 1 || conf[s.ServerID()] != raft.Voter {
			t.Fatalf("configuration %v, want this node alone", conf)
		}
		if _, err := s.CreateTopic(Topic{Name: fmt.Sprintf("new%d", round), TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWipedNodeReachedByTheLeaderFirstStillRejoins: a wiped node started from the peer
// list can hear from the controller before it asks its peers who they are: the leader
// goes on replicating to the node's old Raft server at the same address, and the node
// takes the configuration it receives for its own. Before, its bootstrap then ended
// without a join: the node followed the log as the server it no longer was, its
// heartbeats (under its new server id) were refused, and it stayed dead to the
// controller for good, its replicas never rebuilt (chaos seed 4041). It must ask to be
// admitted as its new self, also after a restart in that state.
func TestWipedNodeReachedByTheLeaderFirstStillRejoins(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarted=%v", restart), func(t *testing.T) {
			net := newTestNet(t)
			defer net.closeAll()
			dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
			ss := startPeers(t, net, dirs)
			if _, err := ss[0].CreateTopic(Topic{Name: "kept", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
				t.Fatal(err)
			}
			victim := ss[2]
			if victim.Leader() {
				victim = ss[1]
			}
			oldSID, dir, id, addr := victim.ServerID(), victim.opts.Dir, victim.NodeID(), victim.addr
			peers := victim.opts.Cluster.Peers
			net.close(victim)
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			// The wiped node's "who are you" round fails until the leader reached it.
			var reached atomic.Bool
			net.mu.Lock()
			net.refuse = func(kind string, _ raft.ServerAddress) error {
				if kind == kindIdentity && !reached.Load() {
					return fmt.Errorf("%w: identity held back by the test", ErrNotDelivered)
				}
				return nil
			}
			net.mu.Unlock()
			s, err := net.open(dir, id, addr, Cluster{Peers: peers})
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the wiped node holds the configuration the leader sent its old server", func() error {
				conf, err := s.configuration()
				if err != nil {
					return err
				}
				for _, srv := range conf.Servers {
					if string(srv.ID) == oldSID {
						return nil
					}
				}
				return fmt.Errorf("configuration %v", conf.Servers)
			})
			if restart {
				net.close(s)
				if s, err = net.open(dir, id, addr, Cluster{Peers: peers}); err != nil {
					t.Fatal(err)
				}
			}
			reached.Store(true)
			waitReplaced(t, oldSID, s, ss...)
			if _, ok := s.Topic("kept"); !ok {
				t.Fatal("the rejoined node does not hold the metadata")
			}
		})
	}
}
