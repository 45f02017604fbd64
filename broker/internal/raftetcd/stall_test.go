package raftetcd

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// TestAStalledNodeDoesNotBlameItsPeers: a node whose clock did not tick for longer
// than half the liveness timeout (SIGSTOP, a paused VM, starvation) made no liveness
// calls either, so on its next tick its peers' silence proves nothing: they stay live,
// and no group they lead is made to elect (TestReplicationPausedLeader met this: the
// continued old leader forced an election and won it back). A peer that stays silent
// afterwards is still found dead one timeout later.
func TestAStalledNodeDoesNotBlameItsPeers(t *testing.T) {
	t.Parallel()
	h, p := tickedHost(false)
	t0 := time.Now()
	p.lastHeard.Store(t0.UnixNano())
	h.tickOnce(t0.Add(10 * time.Millisecond))
	if !p.live {
		t.Fatal("a peer heard 10 ms ago does not count live")
	}
	// Stopped for 3 s: no tick, no liveness call.
	resumed := t0.Add(3 * time.Second)
	h.tickOnce(resumed)
	if !p.live || p.lapses.Load() != 0 {
		t.Fatalf("after this node stalled for 3 s its peer counts live=%v with %d lapses; the stall proves nothing of the peer", p.live, p.lapses.Load())
	}
	// Ticking again, the peer still silent: found dead once the timeout passes.
	for at := resumed.Add(100 * time.Millisecond); at.Before(resumed.Add(1100 * time.Millisecond)); at = at.Add(100 * time.Millisecond) {
		h.tickOnce(at)
	}
	if p.live || p.lapses.Load() != 1 {
		t.Fatalf("a peer silent for a timeout after the stall counts live=%v with %d lapses, want dead once", p.live, p.lapses.Load())
	}
}

// TestAnIdleTickWakesNoSender: with lazy heartbeats a tick sends what the groups'
// heartbeats left queued for each peer. With nothing queued it must not wake the
// peer's sender: on the old code every tick did, for every peer, 20 wake-ups a second
// on each node of an idle 3-node cluster (a profile of the idle cost found them).
func TestAnIdleTickWakesNoSender(t *testing.T) {
	t.Parallel()
	h, p := tickedHost(true)
	now := time.Now()
	p.lastHeard.Store(now.UnixNano())
	h.tickOnce(now)
	if len(p.kick) != 0 {
		t.Fatal("a tick with nothing queued for a peer woke its sender")
	}
	h.send("g", 0, []raftpb.Message{{Type: raftpb.MsgHeartbeat, To: 2}})
	if len(p.kick) != 0 {
		t.Fatal("a lazy heartbeat woke the sender before the tick")
	}
	h.tickOnce(now.Add(10 * time.Millisecond))
	if len(p.kick) != 1 {
		t.Fatal("a tick did not wake the sender of a peer with a heartbeat queued")
	}
}

// tickedHost is a Host of no group, not started, with one peer (id 2), for tests that
// call tickOnce themselves.
func tickedHost(lazy bool) (*Host, *peer) {
	h := &Host{
		opts:   Options{ID: 1, LivenessTimeout: time.Second, Tick: 10 * time.Millisecond, LazyHeartbeats: lazy},
		log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		peers:  map[uint64]*peer{},
		groups: map[string]*group{},
	}
	p := &peer{id: 2, kick: make(chan struct{}, 1), down: make(chan struct{})}
	h.peers[2] = p
	return h, p
}
