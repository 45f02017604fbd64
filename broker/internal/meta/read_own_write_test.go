package meta

import (
	"testing"
	"time"
)

// TestFollowerReadsItsOwnWriteWithASlowStateMachine: a write forwarded by a follower
// returns only once the follower's own state machine has applied it. Raft's applied
// index moves when a batch is handed to the state machine, before Apply runs, so
// waiting on it let a follower answer a create and then not find the topic; with a
// slow Apply that window is wide enough to hit every time.
func TestFollowerReadsItsOwnWriteWithASlowStateMachine(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	var follower *Store
	for _, s := range ss {
		if !s.Leader() {
			follower = s
		}
	}
	slow := func() { time.Sleep(300 * time.Millisecond) }
	follower.fsm.beforeApply.Store(&slow)
	for i, name := range []string{"a", "b", "c"} {
		tp, err := follower.CreateTopic(Topic{Name: name, TopicConfig: TopicConfig{Partitions: 1, RetentionMs: 1000}})
		if err != nil {
			t.Fatalf("create %d through the follower: %v", i, err)
		}
		if got, ok := follower.Topic(name); !ok || got.Incarnation != tp.Incarnation {
			t.Fatalf("create %d: the follower answered before it applied its own write (Topic(%q) = %+v, %v)", i, name, got, ok)
		}
	}
}
