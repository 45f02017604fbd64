package meta

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestDecommissionIsNotUndoneByAStaleStatus: the controller judges a member's silence,
// and a heartbeat rewrites its record, from a read of the state; a decommission that
// commits between the read and the write must survive the write. Else the member is
// suspect, dead or alive again, the controller never moves its replicas off nor
// removes it, and the decommission the API acknowledged is silently lost.
func TestDecommissionIsNotUndoneByAStaleStatus(t *testing.T) {
	for _, stale := range []command{
		// The controller's liveness judgement (controller.go: set_status on silence).
		{Op: "set_status", Name: "n2", ServerID: "n2/d", Status: StatusSuspect},
		{Op: "set_status", Name: "n2", ServerID: "n2/d", Status: StatusDead},
		{Op: "set_status", Name: "n2", ServerID: "n2/d", Status: StatusAlive},
		// A heartbeat with a new address or versions (heard), or the reconcile of the
		// Raft configuration, rewriting the record read before.
		{Op: "set_member", Member: fullMember("n2", StatusAlive)},
		{Op: "set_member", Member: fullMember("n2", StatusJoining)},
	} {
		f := newFSM()
		applyAt(t, f, 1, command{Op: "set_member", Member: fullMember("n2", StatusAlive)})
		if r := applyAt(t, f, 2, command{Op: "set_status", Name: "n2", ServerID: "n2/d", Status: StatusDecommissioning}); r.err != nil {
			t.Fatal(r.err)
		}
		applyAt(t, f, 3, stale)
		if m, _ := f.member("n2"); m.Status != StatusDecommissioning {
			t.Errorf("%s %s applied after the decommission: the member is %s, want decommissioning", stale.Op, statusOf(stale), m.Status)
		}
	}
	// The rest of a rewritten record still applies (a decommissioning member's
	// heartbeat reports its versions), and a node wiped and joined again under a new
	// server id is a new member.
	f := newFSM()
	applyAt(t, f, 1, command{Op: "set_member", Member: fullMember("n2", StatusAlive)})
	applyAt(t, f, 2, command{Op: "set_status", Name: "n2", ServerID: "n2/d", Status: StatusDecommissioning})
	upd := fullMember("n2", StatusDecommissioning)
	upd.MaxVersion, upd.HTTPAddr = 4, "elsewhere:2"
	applyAt(t, f, 3, command{Op: "set_member", Member: upd})
	if m, _ := f.member("n2"); m != *upd {
		t.Fatalf("a decommissioning member's record: %+v, want %+v", m, *upd)
	}
	wiped := fullMember("n2", StatusJoining)
	wiped.ServerID = "n2/e"
	applyAt(t, f, 4, command{Op: "set_member", Member: wiped})
	if m, _ := f.member("n2"); m != *wiped {
		t.Fatalf("a new server of the node: %+v, want %+v", m, *wiped)
	}
}

func statusOf(c command) MemberStatus {
	if c.Member != nil {
		return c.Member.Status
	}
	return c.Status
}

// TestRemovedMemberStaysRemoved: a member record rewritten from a read made before the
// member was removed (a heartbeat reporting new versions, the controller's reconcile)
// must not bring the member back: it would count in placements, version decisions and
// the members list while its Raft server is gone and its server id is refused.
func TestRemovedMemberStaysRemoved(t *testing.T) {
	f := newFSM()
	applyAt(t, f, 1, command{Op: "set_member", Member: fullMember("n2", StatusAlive)})
	applyAt(t, f, 2, command{Op: "set_status", Name: "n2", ServerID: "n2/d", Status: StatusDecommissioning})
	if r := applyAt(t, f, 3, command{Op: "remove_member", Name: "n2", ServerID: "n2/d", MoveOp: &MoveOp{NowMs: 1}}); r.err != nil {
		t.Fatal(r.err)
	}
	stale := fullMember("n2", StatusDecommissioning)
	stale.MaxVersion = 4
	applyAt(t, f, 4, command{Op: "set_member", Member: stale})
	if m, ok := f.member("n2"); ok {
		t.Fatalf("a removed member came back: %+v", m)
	}
	// The node wiped and added again (a new server id) is a new member.
	fresh := fullMember("n2", StatusJoining)
	fresh.ServerID = "n2/e"
	applyAt(t, f, 5, command{Op: "set_member", Member: fresh})
	if m, ok := f.member("n2"); !ok || m != *fresh {
		t.Fatalf("the node under a new server id: %+v %v", m, ok)
	}
}

// TestControllerDecommissionsItself: decommissioning the node that is the controller
// ends with the node removed. The controller rewrote its own member record as alive at
// every tick (its reconcile of the Raft configuration), undoing the decommission
// before it could hand over and be removed.
func TestControllerDecommissionsItself(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	eventually(t, "version 3 committed on every node", func() error {
		for _, s := range ss {
			if v := s.ClusterVersion(); v < 3 {
				return fmt.Errorf("%s holds version %d", s.NodeID(), v)
			}
		}
		if leaderOf(ss...) == nil {
			return errors.New("no controller")
		}
		return nil
	})
	ctl := leaderOf(ss...)
	var other *Store
	for _, s := range ss {
		if s != ctl {
			other = s
		}
	}
	from := other.raft.LastIndex()
	m, err := other.Decommission(ctl.NodeID())
	if err != nil || m.Status != StatusDecommissioning {
		t.Fatalf("decommission of the controller %s: %+v %v", ctl.NodeID(), m, err)
	}
	eventually(t, "the controller node removed", func() error {
		if m, ok := other.Member(ctl.NodeID()); ok {
			return fmt.Errorf("still a member: %+v", m)
		}
		if !other.WasRemoved(ctl.ServerID()) {
			return errors.New("its server id is not marked removed")
		}
		return nil
	})
	// Nor did the controller write its record back as alive meanwhile (once per tick).
	for i := from + 1; i <= other.raft.LastIndex(); i++ {
		var l raft.Log
		if err := other.bolt.GetLog(i, &l); err != nil || l.Type != raft.LogCommand {
			continue
		}
		c, err := decodeCommand(l.Data)
		if err == nil && c.Op == "set_member" && c.Member.ID == ctl.NodeID() && c.Member.Status != StatusDecommissioning {
			t.Fatalf("entry %d rewrote the decommissioning controller's record as %s", i, c.Member.Status)
		}
	}
}

// TestLeaderErrOfNothingIsNothing: a call that succeeded (a leadership transfer that
// went through) is not turned into "control plane unavailable" wrapping nothing, which
// a controller handing itself over logged as a failed step ("%!w(<nil>)").
func TestLeaderErrOfNothingIsNothing(t *testing.T) {
	if err := leaderErr(nil); err != nil {
		t.Fatalf("leaderErr(nil) = %v", err)
	}
	if err := leaderErr(raft.ErrNotLeader); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("leaderErr(raft.ErrNotLeader) = %v", err)
	}
}

// TestAWipedDecommissioningNodeStaysDecommissioning: a node being decommissioned whose
// data directory is wiped and that joins again (a new server id) stays decommissioning
// under its new server, as a non-voter: the operator asked for the node to go. Its
// admission wrote a new member record as joining, which dropped the decommission: the
// node then came back alive, a voter, and a target for placements.
func TestAWipedDecommissioningNodeStaysDecommissioning(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss, live, victim, oldSID := wipedWhileHolding(t, net)
	if m, err := live.Decommission(victim.NodeID()); err != nil || m.Status != StatusDecommissioning {
		t.Fatalf("decommission of %s: %+v %v", victim.NodeID(), m, err)
	}
	s, err := net.open(victim.opts.Dir, victim.NodeID(), victim.addr, Cluster{Join: live.addr})
	if err != nil {
		t.Fatal(err)
	}
	if s.ServerID() == oldSID {
		t.Fatalf("a wiped directory kept its server id %s", oldSID)
	}
	var m Member
	eventually(t, "the new server's member record, past joining", func() error {
		l := leaderOf(ss[0], ss[1], ss[2], s)
		if l == nil {
			return errors.New("no controller")
		}
		m, _ = l.fsm.member(s.NodeID())
		if m.ServerID != s.ServerID() || m.Status == StatusJoining {
			return fmt.Errorf("member %+v", m)
		}
		return nil
	})
	if m.Status != StatusDecommissioning || m.Voter {
		t.Fatalf("the decommissioning node rejoined wiped as %s (voter %v), want decommissioning, not a voter", m.Status, m.Voter)
	}
	conf := serverIDs(t, leaderOf(ss[0], ss[1], ss[2], s))
	if _, ok := conf[oldSID]; ok || conf[s.ServerID()] != raft.Nonvoter {
		t.Fatalf("configuration %v: want the old server %s gone and the new one a non-voter", conf, oldSID)
	}
}

// TestADecommissionDuringAWipedNodesAdmissionHolds: a decommission that commits while
// the controller admits the node's new server (its disk was wiped: the admission read
// the member record, removed the old server and added the new one, and has not yet
// written the new record) must not be dropped. The admission read the record before
// the decommission and wrote the new server's record joining: Decommission answered
// decommissioning, and the node then came back alive, a voter, and was never removed.
func TestADecommissionDuringAWipedNodesAdmissionHolds(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss, live, victim, oldSID := wipedWhileHolding(t, net)
	dir, node := victim.opts.Dir, victim.NodeID()
	type result struct {
		m   Member
		err error
	}
	decided := make(chan result, 1)
	var once sync.Once
	hook := func(j joinRequest) {
		if j.NodeID != node || j.ServerID == oldSID {
			return
		}
		once.Do(func() {
			// The operator decommissions the node now: the new server is in the
			// configuration, its record not written. The admission goes on once the
			// decommission answered (or after a while, should it wait for the
			// admission, which is right too).
			answered := make(chan struct{})
			go func() {
				m, err := live.Decommission(node)
				decided <- result{m, err}
				close(answered)
			}()
			select {
			case <-answered:
			case <-time.After(time.Second):
			}
		})
	}
	live.ctl.beforeRecord.Store(&hook)
	s, err := net.open(dir, node, victim.addr, Cluster{Join: live.addr})
	if err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-decided:
	case <-time.After(30 * time.Second):
		t.Fatal("the decommission did not return")
	}
	if r.err != nil {
		// Refused is fine: the operator was told. Not dropped silently.
		t.Logf("decommission refused: %v", r.err)
		return
	}
	if r.m.Status != StatusDecommissioning {
		t.Fatalf("decommission answered %+v", r.m)
	}

	eventually(t, "the new server's member record, past joining", func() error {
		l := leaderOf(ss[1], ss[2], ss[0], s)
		if l == nil {
			return errors.New("no controller")
		}
		m, _ := l.fsm.member(node)
		if m.ServerID != s.ServerID() || m.Status == StatusJoining {
			return fmt.Errorf("member %+v", m)
		}
		return nil
	})
	m, _ := leaderOf(ss[1], ss[2], ss[0], s).fsm.member(node)
	if m.Status != StatusDecommissioning {
		t.Fatalf("Decommission(%s) answered decommissioning, and the node's new server %s (old %s) is now %s (voter %v): the decommission was dropped",
			node, s.ServerID(), oldSID, m.Status, m.Voter)
	}
}

// wipedWhileHolding starts three nodes with version 3 committed and all alive, puts one
// partition on each (so a decommission of a node does not end while a test looks:
// nothing here copies a replica), then stops a node other than the controller and
// wipes its data directory. It returns the nodes, the controller, the wiped node's
// Store (closed) and its old server id.
func wipedWhileHolding(t *testing.T, net *testNet) (ss []*Store, live, victim *Store, oldSID string) {
	t.Helper()
	ss = startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	eventually(t, "version 3 committed on every node, three alive members", func() error {
		for _, s := range ss {
			if v := s.ClusterVersion(); v < 3 {
				return fmt.Errorf("%s holds version %d", s.NodeID(), v)
			}
		}
		l := leaderOf(ss...)
		if l == nil {
			return errors.New("no controller")
		}
		for _, m := range l.Members() {
			if m.Status != StatusAlive {
				return fmt.Errorf("member %+v", m)
			}
		}
		return nil
	})
	live = leaderOf(ss...)
	if _, err := live.CreateTopic(Topic{Name: "held", TopicConfig: TopicConfig{Partitions: 3, ReplicationFactor: 1}}); err != nil {
		t.Fatal(err)
	}
	victim = ss[0]
	if victim == live {
		victim = ss[1]
	}
	if tp, _ := live.Topic("held"); !slices.ContainsFunc(tp.Placement, func(p Placement) bool { return slices.Contains(p.Replicas, victim.NodeID()) }) {
		t.Fatalf("no partition on %s: %+v", victim.NodeID(), tp.Placement)
	}
	oldSID = victim.ServerID()
	net.close(victim)
	if err := os.RemoveAll(victim.opts.Dir); err != nil {
		t.Fatal(err)
	}
	return ss, live, victim, oldSID
}
