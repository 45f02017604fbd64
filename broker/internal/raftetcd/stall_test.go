package raftetcd

import (
	"io"
	"log/slog"
	"testing"
	"time"
)

// TestAStalledNodeDoesNotBlameItsPeers: a node whose clock did not tick for longer
// than half the liveness timeout (SIGSTOP, a paused VM, starvation) made no liveness
// calls either, so on its next tick its peers' silence proves nothing: they stay live,
// and no group they lead is made to elect (TestReplicationPausedLeader met this: the
// continued old leader forced an election and won it back). A peer that stays silent
// afterwards is still found dead one timeout later.
func TestAStalledNodeDoesNotBlameItsPeers(t *testing.T) {
	h := &Host{
		opts:   Options{ID: 1, LivenessTimeout: time.Second, Tick: 10 * time.Millisecond},
		log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		peers:  map[uint64]*peer{},
		groups: map[string]*group{},
	}
	p := &peer{id: 2, kick: make(chan struct{}, 1), down: make(chan struct{})}
	h.peers[2] = p
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
