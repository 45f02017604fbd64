package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/cluster"
	"github.com/narad-mq/narad/broker/internal/meta"
)

// startReplCluster starts n real cluster nodes in this process: node planes (QUIC on
// 127.0.0.1, free ports), the control plane and replicated partitions, each on its own
// temp data directory (NARAD_TEST_LOG=1 shows their logs). Everything is closed when
// the test ends.
func startReplCluster(t *testing.T, n int, autoRebalance bool) []*Broker {
	t.Helper()
	bs, _ := startHookedReplCluster(t, n, autoRebalance)
	return bs
}

// hookedPeers is a node's node plane with a hook a test can set on the calls it makes.
type hookedPeers struct {
	Peers
	hook atomic.Pointer[func(ctx context.Context, addr string, req dataReq, deliver func() ([]byte, error)) ([]byte, error)]
}

func (h *hookedPeers) Call(ctx context.Context, addr string, body []byte) ([]byte, error) {
	deliver := func() ([]byte, error) { return h.Peers.Call(ctx, addr, body) }
	if f := h.hook.Load(); f != nil {
		var req dataReq
		if err := json.Unmarshal(body, &req); err == nil {
			return (*f)(ctx, addr, req, deliver)
		}
	}
	return deliver()
}

// startHookedReplCluster is startReplCluster with each node's calls to the others
// going through a hookedPeers.
func startHookedReplCluster(t *testing.T, n int, autoRebalance bool) ([]*Broker, []*hookedPeers) {
	t.Helper()
	return startHookedReplClusterAt(t, make([]int, n), autoRebalance)
}

// startReplClusterAt is startReplCluster with, per node, the highest cluster version it
// offers (0: the highest this binary speaks), as in a rolling upgrade.
func startReplClusterAt(t *testing.T, versionMax []int) []*Broker {
	t.Helper()
	bs, _ := startHookedReplClusterAt(t, versionMax, false)
	return bs
}

func startHookedReplClusterAt(t *testing.T, versionMax []int, autoRebalance bool) ([]*Broker, []*hookedPeers) {
	t.Helper()
	n := len(versionMax)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("NARAD_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	secret := []byte("replicated-cluster-test-secret-0")
	planes := make([]*cluster.Plane, n)
	var peers []meta.Peer
	for i := range n {
		p, err := cluster.Start(cluster.Options{NodeID: fmt.Sprintf("n%d", i+1), ListenAddr: "127.0.0.1:0", Secret: secret, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		planes[i] = p
		peers = append(peers, meta.Peer{ID: fmt.Sprintf("n%d", i+1), Addr: raft.ServerAddress(p.Addr())})
	}
	bs := make([]*Broker, n)
	hooked := make([]*hookedPeers, n)
	for i := range n {
		hooked[i] = &hookedPeers{Peers: planes[i]}
		b, err := Open(Options{
			DataDir: t.TempDir(), NodeID: fmt.Sprintf("n%d", i+1), Logger: logger.With("node", fmt.Sprintf("n%d", i+1)),
			Peers: hooked[i], Node: planes[i].Node(),
			Cluster: meta.Cluster{
				Transport: planes[i].RaftTransport(), LocalAddr: raft.ServerAddress(planes[i].Addr()), Forwarder: planes[i],
				Peers: peers, HTTPAddr: fmt.Sprintf("127.0.0.1:%d", 1+i),
				AutoRebalance: autoRebalance, MaxMoves: 2, VersionMax: versionMax[i],
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		planes[i].Serve(b.HandleForward)
		planes[i].ServeData(b.HandleData, b.CheckPeer)
		bs[i] = b
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, b := range bs {
			wg.Add(1)
			go func() { defer wg.Done(); _ = b.Close() }()
		}
		wg.Wait()
		for _, p := range planes {
			_ = p.Close()
		}
	})
	startAll(t, bs, 90*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	want := meta.VersionMax
	for _, v := range versionMax {
		if v != 0 {
			want = min(want, v)
		}
	}
	for !allAlive(bs, n) || !sameVersion(bs, want) {
		if time.Now().After(deadline) {
			t.Fatal("the cluster's members were not all alive within 60 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return bs, hooked
}

// sameVersion reports whether every broker runs cluster version want.
func sameVersion(bs []*Broker, want int) bool {
	for _, b := range bs {
		if b.meta.ClusterVersion() != want {
			return false
		}
	}
	return true
}

// leaderIndex returns which broker leads partition p of topic name (-1: none).
func leaderIndex(bs []*Broker, name string, p int) int {
	for k, b := range bs {
		t, err := b.lookup(name)
		if err != nil {
			continue
		}
		if p < len(t.parts()) && t.leads(p) {
			return k
		}
	}
	return -1
}

// waitOrFail polls cond until it holds, failing the test after bound.
func waitOrFail(t *testing.T, bound time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after %v: %v", what, bound, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
