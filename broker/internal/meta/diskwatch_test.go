package meta

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// slowLogs is a log store whose writes wait for release (a disk in a slow fsync).
type slowLogs struct {
	raft.LogStore
	release chan struct{}
}

func (s slowLogs) StoreLogs([]*raft.Log) error {
	if s.release != nil {
		<-s.release
	}
	return nil
}

// TestStalledTimesTheControlPlanesWrites: a write of the control plane's Raft store
// in flight for the stall threshold makes Stalled true; the verdict holds after that
// slow write ends, and a quick write clears it.
func TestStalledTimesTheControlPlanesWrites(t *testing.T) {
	w := &diskWatch{stallFor: 200 * time.Millisecond}
	if w.stalled() {
		t.Fatal("stalled before any write")
	}
	release := make(chan struct{})
	slow := watchedStore{LogStore: slowLogs{release: release}, w: w}
	done := make(chan error, 1)
	go func() { done <- slow.StoreLogs(nil) }()
	deadline := time.Now().Add(30 * time.Second)
	for !w.stalled() {
		if time.Now().After(deadline) {
			t.Fatal("a write in flight for far past the threshold does not count as a stall")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !w.stalled() {
		t.Fatal("the stall ended with its slow write: it must hold until a quick write ends")
	}
	quick := watchedStore{LogStore: slowLogs{}, w: w}
	if err := quick.StoreLogs(nil); err != nil {
		t.Fatal(err)
	}
	if w.stalled() {
		t.Fatal("still stalled after a quick write")
	}
}

// stallDisk makes s's control-plane disk look stalled, as a write in flight for two
// seconds does, until the returned function is called.
func stallDisk(s *Store) (end func()) {
	s.watch.mu.Lock()
	s.watch.active++
	s.watch.since = time.Now().Add(-2 * StallWrite)
	s.watch.mu.Unlock()
	return func() {
		s.watch.mu.Lock()
		s.watch.active--
		s.watch.mu.Unlock()
	}
}

// TestStallingControllerHandsItOverToAFitVoter: Raft's heartbeats go on while each of
// the controller's log writes takes seconds, so nothing moved the controller off a
// stalling disk and every metadata write waited for it. It hands the controller over
// now, to a voter that is alive and not itself unfit (here n2 says its disk stalls
// too, so it is skipped), and a write through the new controller goes through.
func TestStallingControllerHandsItOverToAFitVoter(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	var unfit atomic.Value
	unfit.Store("")
	net.cluster = func(c *Cluster) {
		c.PeerUnfit = func(sid string) bool { return sid == unfit.Load().(string) }
	}
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	ctl := controllerOf(t, ss...)
	var others []*Store
	for _, s := range ss {
		if s != ctl {
			others = append(others, s)
		}
	}
	skip, want := others[0], others[1]
	unfit.Store(skip.ServerID())
	end := stallDisk(ctl)
	defer end()
	eventually(t, "the controller moved off the stalling disk", func() error {
		l := leaderOf(ss...)
		switch {
		case l == nil:
			return errors.New("no controller")
		case l == ctl:
			return errors.New(ctl.NodeID() + " still leads")
		case l == skip:
			t.Fatalf("the controller went to %s, which said its disk stalls too", skip.NodeID())
		}
		return nil
	})
	if l := leaderOf(ss...); l != want {
		t.Fatalf("controller %v, want %s", l, want.NodeID())
	}
	if _, err := ss[0].CreateTopic(Topic{Name: "after-the-stall", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
		t.Fatal(err)
	}
}

// TestStallingControllerStaysWithoutAFitVoter: when every other voter is unfit, a
// slow controller is better than none: it keeps the controller.
func TestStallingControllerStaysWithoutAFitVoter(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	var healthy atomic.Value
	healthy.Store("")
	net.cluster = func(c *Cluster) {
		c.PeerUnfit = func(sid string) bool { return sid != healthy.Load().(string) }
	}
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	ctl := controllerOf(t, ss...)
	healthy.Store(ctl.ServerID())
	end := stallDisk(ctl)
	defer end()
	if ctl.handOverStalled() {
		t.Fatal("handed the controller to a voter that is unfit itself")
	}
	if !ctl.Leader() {
		t.Fatal("the controller moved although no voter was fit to take it")
	}
}

// TestControllersOnStallingDisksStillFindADeadMemberDead: a new controller counts every
// member's silence from its own election, and the limit on stall handovers was per
// node, so two nodes whose disks stall in turn handed the controller to each other
// faster than DeadAfter, and a third node that died was never found dead (nothing
// would be moved off it). A controller hands over for a stall only once it has led
// for DeadAfter now. Raft timeout 400 ms (a node's limit 4 s), DeadAfter 12 s: three
// limits, as production's 30 s against 10 s. Found by an adversarial review (5
// December); fails on the code before (the controller changed about ten times).
func TestControllersOnStallingDisksStillFindADeadMemberDead(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	net.cluster = func(c *Cluster) { c.SuspectAfter = time.Second; c.DeadAfter = 12 * time.Second }
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	ctl := controllerOf(t, ss...)
	var dead *Store
	var live []*Store
	for _, s := range ss {
		if s != ctl && dead == nil {
			dead = s
		} else {
			live = append(live, s)
		}
	}
	deadID := dead.NodeID()
	net.close(dead)
	changes := 0
	var last *Store
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range live[0].Members() {
			if m.ID == deadID && m.Status == StatusDead {
				t.Logf("found dead after %d changes of controller", changes)
				return
			}
		}
		l := leaderOf(live...)
		if l != nil && l != last {
			changes++
			last = l
		}
		if l != nil && !l.Stalled() {
			end := stallDisk(l) // a write in flight for 2 s, for 1.5 s more
			time.AfterFunc(1500*time.Millisecond, end)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s stopped 40 s ago (DeadAfter 12 s) and is not found dead: the controller changed %d times meanwhile", deadID, changes)
}
