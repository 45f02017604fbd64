package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestFollowerIsNotReadyUntilItConfirmedItCaughtUp: a node that was down while a topic
// was made is not ready, though it knows a controller, until the controller told it
// how far to apply and it applied that far.
func TestFollowerIsNotReadyUntilItConfirmedItCaughtUp(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	down := ss[2]
	if down.Leader() {
		down = ss[1]
	}
	net.close(down)
	l := leaderOf(ss...)
	if _, err := l.CreateTopic(Topic{Name: "made-while-down", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int32
	net.mu.Lock()
	net.refuse = func(kind string, addr raft.ServerAddress) error {
		if kind == kindReadIndex {
			refused.Add(1)
			return errors.New("read index refused by the test")
		}
		return nil
	}
	net.mu.Unlock()
	s, err := net.open(down.opts.Dir, down.NodeID(), down.addr, Cluster{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restarted node knows the controller and asked it in vain", func() error {
		if addr, _ := s.raft.LeaderWithID(); addr == "" || refused.Load() < 3 {
			return fmt.Errorf("leader %q, %d refused", addr, refused.Load())
		}
		return nil
	})
	if s.Ready() {
		t.Fatal("ready without having confirmed it caught up with the controller")
	}
	net.mu.Lock()
	net.refuse = nil
	net.mu.Unlock()
	waitReady(t, s)
	if _, ok := s.Topic("made-while-down"); !ok {
		t.Fatal("ready but without the topic made while it was down")
	}
}

// TestACommandFromANewerVersionHalts: an unknown command does not crash the node and is
// not skipped: the state machine stops applying there, takes no snapshot, the node is
// not ready and writes fail with ErrHalted, also after a restart (the log is replayed).
func TestACommandFromANewerVersionHalts(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.raft.Apply(frame([]byte(`{"op":"from_the_future"}`)), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.raft.Apply(frame([]byte(`{"op":"create_topic","topic":{"name":"after","partitions":1}}`)), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		if s.Ready() {
			t.Fatal("ready with a halted state machine")
		}
		if _, ok := s.Topic("after"); ok {
			t.Fatal("a command after the unknown one was applied")
		}
		if _, err := s.CreateTopic(Topic{Name: "x", TopicConfig: TopicConfig{Partitions: 1}}); !errors.Is(err, ErrHalted) {
			t.Fatalf("write on a halted node: %v, want ErrHalted", err)
		}
		if _, err := s.fsm.Snapshot(); !errors.Is(err, ErrHalted) {
			t.Fatalf("snapshot of a halted state: %v, want ErrHalted", err)
		}
	}
	check()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var err error
	if s, err = Open(Options{Dir: dir, NodeID: "n1"}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); !errors.Is(err, ErrHalted) || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("WaitReady after a restart: %v, want ErrHalted saying to upgrade", err)
	}
	check()
}

// TestClusterCommandsAreIdempotentAndSnapshotted: init_cluster, set_member and
// set_status applied twice leave the state they left once, and a snapshot carries the
// cluster id, members and placements.
func TestClusterCommandsAreIdempotentAndSnapshotted(t *testing.T) {
	m1 := Member{ID: "a", ServerID: "a/1", ClusterAddr: "x", Status: StatusAlive, Voter: true}
	m2 := Member{ID: "b", ServerID: "b/1", ClusterAddr: "y", Status: StatusAlive, Voter: true}
	cmds := []command{
		{Op: "create_topic", Topic: &Topic{Name: "old", TopicConfig: TopicConfig{Partitions: 2}}},
		{Op: "init_cluster", ClusterID: "c1", Members: []Member{m1}},
		{Op: "set_member", Member: &m2},
		{Op: "create_topic", Topic: &Topic{Name: "new", TopicConfig: TopicConfig{Partitions: 4}}},
		{Op: "set_status", Name: "b", ServerID: "b/1", Status: StatusSuspect},
		{Op: "init_cluster", ClusterID: "c2", Members: []Member{m2}},
	}
	once, twice := newFSM(), newFSM()
	for i, c := range cmds {
		b, err := encodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		once.Apply(&raft.Log{Index: uint64(i + 1), Data: b})
		twice.Apply(&raft.Log{Index: uint64(i + 1), Data: b})
		if c.Op != "create_topic" {
			twice.Apply(&raft.Log{Index: uint64(i + 1), Data: b})
		}
	}
	if once.cluster() != "c1" {
		t.Fatalf("cluster id %q, want the first init's", once.cluster())
	}
	if fmt.Sprint(once.memberList(), once.list()) != fmt.Sprint(twice.memberList(), twice.list()) {
		t.Fatalf("applied twice differs:\n%v\n%v", once.memberList(), twice.memberList())
	}
	old, _ := once.topic("old")
	if len(old.Placement) != 2 || old.Placement[0].Leader != "a" {
		t.Fatalf("old topic placed at init: %+v", old.Placement)
	}
	loads := once.loads()
	if loads["a"].Held != 3 || loads["b"].Held != 3 || loads["a"].Led != 3 {
		t.Fatalf("loads %+v: want the new topic's partitions spread to even out a and b", loads)
	}
	if m, _ := once.member("b"); m.Status != StatusSuspect {
		t.Fatalf("member b %+v, want suspect", m)
	}
	// A status judged on an older server of the node does not apply.
	b, _ := encodeCommand(command{Op: "set_status", Name: "b", ServerID: "b/0", Status: StatusDead})
	once.Apply(&raft.Log{Index: 99, Data: b})
	if m, _ := once.member("b"); m.Status != StatusSuspect {
		t.Fatalf("a status for an old server applied: %+v", m)
	}

	snap, err := once.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	restored := newFSM()
	if err := restored.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if restored.cluster() != "c1" || fmt.Sprint(restored.memberList(), restored.list()) != fmt.Sprint(once.memberList(), once.list()) {
		t.Fatalf("restored state differs: %q %v %v", restored.cluster(), restored.memberList(), restored.list())
	}
}

func TestJoinsAsVoterUpToMaxVoters(t *testing.T) {
	var conf raft.Configuration
	for i := 0; i < 6; i++ {
		v := joinsAsVoter(conf, 5)
		if want := i < 5; v != want {
			t.Fatalf("server %d joins as voter %v, want %v", i+1, v, want)
		}
		sf := raft.Nonvoter
		if v {
			sf = raft.Voter
		}
		conf.Servers = append(conf.Servers, raft.Server{ID: raft.ServerID(fmt.Sprint(i)), Suffrage: sf})
	}
}

// TestTheReadyLoopWaitsForChanges: a ready node's ready loop sleeps until Raft's leader
// changes (or its once-a-second recheck); it polled every 10 ms before, most of an idle
// node's CPU.
func TestTheReadyLoopWaitsForChanges(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	defer s.Close()
	before := s.readyWakes.Load()
	time.Sleep(500 * time.Millisecond)
	if n := s.readyWakes.Load() - before; n > 2 {
		t.Fatalf("the ready loop of an idle ready node woke %d times in 500 ms; it should wake only on a change of controller or its 1 s recheck", n)
	}
}

// TestANodeWithoutAControllerForSuspectAfterIsNotReady: a node that has known no
// controller for SuspectAfter (1 s here) stops being ready (a timer, not a poll, now
// says when), and is ready again once a controller is back and it caught up.
func TestANodeWithoutAControllerForSuspectAfterIsNotReady(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	ss := startPeers(t, net, dirs)
	left := ss[2]
	closed := time.Now()
	net.close(ss[0])
	net.close(ss[1])
	eventually(t, "the left node to stop being ready", func() error {
		if left.ready.Load() {
			return errors.New("still ready")
		}
		return nil
	})
	if d := time.Since(closed); d < time.Second {
		t.Fatalf("not ready %v after the others closed; it may not be before SuspectAfter (1 s) without a controller", d)
	}
	for i := range 2 {
		s, err := net.open(dirs[i], ss[i].NodeID(), ss[i].addr, Cluster{})
		if err != nil {
			t.Fatal(err)
		}
		ss[i] = s
	}
	waitReady(t, ss...)
	if !left.ready.Load() {
		t.Fatal("ready (lease and all) but the ready loop's flag is down")
	}
}

// TestACatchUpMovesToANewControllerAtOnce: a node that is catching up (not ready)
// while its controller dies, its read-index request to it hanging, catches up with the
// new controller as soon as it learns of it. It used to wait the hung request out
// (ApplyTimeout, 5 s by default) and serve nothing meanwhile.
func TestACatchUpMovesToANewControllerAtOnce(t *testing.T) {
	// Its catch-up says when it is hanging.
	_, old, follower, hung, cut := deadController(t, 0, kindReadIndex)
	knownAt := newControllerAt(follower, old.addr)
	// The follower must catch up again (as after losing its controller for
	// SuspectAfter); its ready loop looks at least once a second.
	follower.ready.Store(false)
	select {
	case <-hung:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not try to catch up with its controller")
	}
	// Now the controller dies for Raft too: the others elect a new one.
	cut()
	known := waitKnown(t, knownAt)
	const bound = 3 * time.Second // the hung request waits ApplyTimeout, 10 s here
	for !follower.Ready() {
		if time.Since(known) > bound {
			t.Fatalf("the follower knew the new controller %v ago and has not caught up with it", bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("ready %v after the new controller was known", time.Since(known).Round(time.Millisecond))
}

// TestAHaltedNodeDoesNotAskToCatchUp: a node whose state machine halted (here a binary
// that speaks only cluster version 1 restarted into a cluster at version 2) cannot
// apply what a catch-up waits for, so it does not try: each try appends a barrier on
// the controller, and its ready loop tried every 10 ms, about 75 barriers a second
// replicated through the cluster for as long as the node stayed up (found in review).
func TestAHaltedNodeDoesNotAskToCatchUp(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	_, h := withAHaltedNode(t, net)
	var asks atomic.Int64
	net.mu.Lock()
	net.hang = func(kind string, addr raft.ServerAddress) <-chan struct{} {
		if kind == kindReadIndex {
			asks.Add(1) // a catch-up: the others are ready and renew with Sync instead
		}
		return nil
	}
	net.mu.Unlock()
	time.Sleep(2 * time.Second)
	if n := asks.Load(); n > 2 {
		t.Fatalf("%d catch-up requests in 2 s from a halted node; want none", n)
	}
	if h.Ready() {
		t.Fatal("a halted node is ready")
	}
}
