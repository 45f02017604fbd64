package meta

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestAWriteTheControllerNeverAppliesIsAnsweredInTime: a write the controller proposed
// and committed, but whose Raft stopped before its state machine applied it, is
// answered "outcome unknown" within the apply timeout plus an election instead of
// never. hashicorp/raft answers a command's future only from its state-machine
// goroutine, which returns when Raft shuts down and drops the batches still queued for
// it; a Store closing under a forwarded write or heartbeat (whose handler the Store
// does not wait for) left that handler waiting for ever (a meta test run hung 9
// minutes on it). The test holds the controller's state machine at the write, then
// shuts its Raft down: from then on the write is never applied there.
func TestAWriteTheControllerNeverAppliesIsAnsweredInTime(t *testing.T) {
	net := newTestNet(t)
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	ctl := controllerOf(t, ss...)
	release := make(chan struct{})
	held := make(chan struct{}, 1)
	var armed atomic.Bool
	hold := func() {
		if armed.Load() {
			select {
			case held <- struct{}{}:
			default:
			}
			<-release
		}
	}
	ctl.fsm.beforeApply.Store(&hold)
	defer func() {
		close(release)
		for _, s := range ss {
			if s != ctl {
				net.close(s)
			}
		}
		// The controller's own loops may wait on writes its Raft never answers: on the
		// old code its Close never returned.
		closed := make(chan struct{})
		go func() {
			net.close(ctl)
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(60 * time.Second):
			t.Errorf("the controller did not close within 60s: a loop still waits on Raft")
		}
	}()

	armed.Store(true)
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := ctl.CreateTopic(Topic{Name: "unapplied", TopicConfig: TopicConfig{Partitions: 1}})
		done <- err
	}()
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the controller's state machine applied nothing within 30s")
	}
	eventually(t, "the write committed", func() error {
		for i := ctl.raft.LastIndex(); i > 0; i-- {
			var l raft.Log
			if err := ctl.bolt.GetLog(i, &l); err != nil {
				return err
			}
			if l.Type != raft.LogCommand || !strings.Contains(string(l.Data), `"unapplied"`) {
				continue
			}
			if c := ctl.raft.CommitIndex(); c < i {
				return fmt.Errorf("entry %d not committed yet (commit index %d)", i, c)
			}
			return nil
		}
		return errors.New("not in the controller's log yet")
	})
	// Committed on a quorum; Raft stops before its state machine gets to it.
	ctl.raft.Shutdown()
	bound := ctl.opts.ApplyTimeout + ctl.opts.Cluster.RaftTimeout
	select {
	case err := <-done:
		took := time.Since(start)
		t.Logf("answered after %v: %v", took.Round(time.Millisecond), err)
		if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("a write committed but never applied here answered %v, want ErrOutcomeUnknown (a kind of ErrUnavailable)", err)
		}
		if took < bound/2 {
			t.Fatalf("answered after %v, before Raft had its apply timeout (%v) to answer", took, ctl.opts.ApplyTimeout)
		}
	case <-time.After(bound + 30*time.Second):
		t.Fatalf("the write is still waiting %v after it was proposed (bound: the apply timeout plus an election, %v)", time.Since(start).Round(time.Second), bound)
	}
}

// TestAControllerCutOffMidWriteAnswersOutcomeUnknown: the controller's links to both
// other voters are cut just as it takes a write. It steps down within its leader lease
// (its replication and heartbeats run apart from its main loop, so failing calls do not
// hold the lease check back) and fails the write, whose entry it had appended: another
// node may have it and commit it, so the answer is ErrOutcomeUnknown, not a plain
// ErrUnavailable the HTTP API would answer as safe to retry. (Raft refusing the write
// before appending it, when the lease check came first, is ErrNotLeader: not written.)
func TestAControllerCutOffMidWriteAnswersOutcomeUnknown(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	ctl := controllerOf(t, ss...)
	net.mu.Lock()
	for _, s := range ss {
		if s != ctl {
			net.trans[ctl.addr].Disconnect(s.addr)
			net.trans[s.addr].Disconnect(ctl.addr)
		}
	}
	net.mu.Unlock()
	start := time.Now()
	_, err := ctl.applyLocal(command{Op: "create_topic", Topic: &Topic{Name: "cut", TopicConfig: TopicConfig{Partitions: 1}}})
	took := time.Since(start)
	t.Logf("answered after %v: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, ErrOutcomeUnknown) && !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a write the cut-off controller had taken answered %v, want ErrOutcomeUnknown (or ErrNotLeader had it refused it first)", err)
	}
	if bound := ctl.opts.Cluster.RaftTimeout * 5; took > bound {
		t.Fatalf("answered after %v: a controller cut off from its quorum should step down within its lease (%v)", took, ctl.opts.Cluster.RaftTimeout/2)
	}
}

// TestOutcomeUnknownTravelsToTheForwardingNode: a write a follower forwarded, whose
// outcome the controller does not know, is of unknown outcome on the follower too
// (503 timeout there, not 503 unavailable); a node of an earlier version, which knows
// no such error, still reads the "unavailable" it knows.
func TestOutcomeUnknownTravelsToTheForwardingNode(t *testing.T) {
	w := toWire(fmt.Errorf("%w: create_topic", ErrOutcomeUnknown))
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	var back wireError
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got := fromWire(&back); !errors.Is(got, ErrOutcomeUnknown) || !errors.Is(got, ErrUnavailable) {
		t.Errorf("forwarded outcome unknown read back as %v (%s)", got, b)
	}
	var old struct {
		Code string `json:"code"`
		Msg  string `json:"msg"`
	}
	if err := json.Unmarshal(b, &old); err != nil || old.Code != "unavailable" {
		t.Errorf("a node of an earlier version reads code %q from %s, want unavailable", old.Code, b)
	}
	if got := fromWire(toWire(fmt.Errorf("%w: no controller", ErrUnavailable))); errors.Is(got, ErrOutcomeUnknown) || !errors.Is(got, ErrUnavailable) {
		t.Errorf("a plain unavailable read back as %v", got)
	}
}

// TestAForwardedWriteWithoutAnAnswerIsOfUnknownOutcome: a write forwarded to the
// controller that reached it (the Forwarder does not say it was not delivered) but
// brought no answer may have happened: ErrOutcomeUnknown, not a plain ErrUnavailable.
func TestAForwardedWriteWithoutAnAnswerIsOfUnknownOutcome(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	ctl := controllerOf(t, ss...)
	via := followerOf(ctl, ss...)
	net.mu.Lock()
	net.refuse = func(kind string, addr raft.ServerAddress) error {
		if kind == kindApply {
			return errors.New("the connection broke after the request was sent")
		}
		return nil
	}
	net.mu.Unlock()
	_, err := via.CreateTopic(Topic{Name: "no-answer", TopicConfig: TopicConfig{Partitions: 1}})
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a forwarded write without an answer: %v, want ErrOutcomeUnknown", err)
	}
}

// TestAForwardedWriteCommittedButNotAppliedHereIsOfUnknownOutcome: a follower forwards
// a write, the controller commits and answers it, but the follower's own state machine
// does not apply it within the apply timeout (held here). The write happened: the
// answer must not be a plain ErrUnavailable, which the HTTP API answers "503
// unavailable" (documented as "no controller took it": safe to send again), so a
// client sending it again would make it twice (a second remote child) or be refused
// as a conflict for its own write. It is ErrOutcomeUnknown (503 timeout).
func TestAForwardedWriteCommittedButNotAppliedHereIsOfUnknownOutcome(t *testing.T) {
	net := newTestNet(t)
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	ctl := controllerOf(t, ss...)
	via := followerOf(ctl, ss...)
	release := make(chan struct{})
	var armed atomic.Bool
	hold := func() {
		if armed.Load() {
			<-release
		}
	}
	via.fsm.beforeApply.Store(&hold)
	defer func() {
		armed.Store(false)
		close(release)
		net.closeAll()
	}()
	armed.Store(true)
	_, err := via.CreateTopic(Topic{Name: "applied-elsewhere", TopicConfig: TopicConfig{Partitions: 1}})
	if _, ok := ctl.Topic("applied-elsewhere"); !ok {
		t.Fatalf("the controller does not hold the topic (the write answered %v)", err)
	}
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a write the controller committed, not yet applied on the forwarding node, answered %v; want ErrOutcomeUnknown", err)
	}
}

// TestAForwardedWriteRefusedButNotAppliedHereKeepsItsRefusal: a forwarded write the
// controller's state machine refused (a conflict) has a known outcome even when the
// forwarding node has not applied that entry in time: the caller gets the refusal (409),
// not a 503 (the entry is past the topic's creation, which this node applied).
func TestAForwardedWriteRefusedButNotAppliedHereKeepsItsRefusal(t *testing.T) {
	net := newTestNet(t)
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	ctl := controllerOf(t, ss...)
	via := followerOf(ctl, ss...)
	if _, err := ctl.CreateTopic(Topic{Name: "taken", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the forwarding node to know the topic", func() error {
		if _, ok := via.Topic("taken"); !ok {
			return errors.New("not yet")
		}
		return nil
	})
	release := make(chan struct{})
	var armed atomic.Bool
	hold := func() {
		if armed.Load() {
			<-release
		}
	}
	via.fsm.beforeApply.Store(&hold)
	defer func() {
		armed.Store(false)
		close(release)
		net.closeAll()
	}()
	armed.Store(true)
	_, err := via.applyCmd(command{Op: "create_topic", Topic: &Topic{Name: "taken", TopicConfig: TopicConfig{Partitions: 1}}})
	if !errors.Is(err, ErrTopicExists) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("a forwarded create of an existing topic, not yet applied on the forwarding node, answered %v; want ErrTopicExists", err)
	}
}
