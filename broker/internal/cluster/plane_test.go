package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/transport"
)

var secret = []byte("plane-test-secret-0123456789")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startPlane(t *testing.T, id string, s []byte) *Plane {
	t.Helper()
	p, err := Start(Options{NodeID: id, ListenAddr: "127.0.0.1:0", Secret: s, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after 60s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestControlPlaneOverTheNodePlane: three control planes bootstrap from a peer list
// with Raft and forwarding on the node plane, a write on a follower reaches the
// controller, and the metrics move.
func TestControlPlaneOverTheNodePlane(t *testing.T) {
	ids := []string{"n1", "n2", "n3"}
	planes := make([]*Plane, len(ids))
	var peers []meta.Peer
	for i, id := range ids {
		planes[i] = startPlane(t, id, secret)
		peers = append(peers, meta.Peer{ID: id, Addr: raft.ServerAddress(planes[i].Addr())})
	}
	stores := make([]*meta.Store, len(ids))
	for i, id := range ids {
		s, err := meta.Open(meta.Options{Dir: t.TempDir(), NodeID: id, Logger: quiet(), Cluster: meta.Cluster{
			Transport: planes[i].RaftTransport(), Forwarder: planes[i], Peers: peers,
			HTTPAddr: "http://" + id, HeartbeatInterval: 200 * time.Millisecond,
		}})
		if err != nil {
			t.Fatal(err)
		}
		planes[i].Serve(s.HandleForward)
		stores[i] = s
	}
	t.Cleanup(func() {
		for i := range stores {
			stores[i].Close()
			planes[i].Close()
		}
	})
	for _, s := range stores {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		err := s.WaitReady(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", s.NodeID(), err)
		}
	}
	var follower *meta.Store
	for _, s := range stores {
		if !s.Leader() {
			follower = s
		}
	}
	tp, err := follower.CreateTopic(meta.Topic{Name: "orders", TopicConfig: meta.TopicConfig{Partitions: 3, RetentionMs: 1000}})
	if err != nil || tp.Incarnation == 0 {
		t.Fatalf("create through a follower: %+v %v", tp, err)
	}
	eventually(t, "every node has the topic and three members", func() error {
		for _, s := range stores {
			if _, ok := s.Topic("orders"); !ok {
				return fmt.Errorf("%s lacks orders", s.NodeID())
			}
			if n := len(s.Members()); n != 3 {
				return fmt.Errorf("%s knows %d members", s.NodeID(), n)
			}
			if s.ClusterID() == "" || s.ClusterID() != stores[0].ClusterID() {
				return fmt.Errorf("cluster ids %q and %q", s.ClusterID(), stores[0].ClusterID())
			}
		}
		return nil
	})

	reg := prometheus.NewRegistry()
	fp := planes[0]
	for i, s := range stores {
		if s == follower {
			fp = planes[i]
		}
	}
	if err := fp.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := RegisterControlPlane(reg, follower.RaftState); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "narad_cluster_forward_duration_seconds"); err != nil || n == 0 {
		t.Fatalf("forward histogram: %d series, %v", n, err)
	}
	want := `
# HELP narad_control_plane_state 1 for this node's current control-plane role (Leader: it is the controller), 0 for the others.
# TYPE narad_control_plane_state gauge
narad_control_plane_state{state="Candidate"} 0
narad_control_plane_state{state="Follower"} 1
narad_control_plane_state{state="Leader"} 0
narad_control_plane_state{state="Shutdown"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "narad_control_plane_state"); err != nil {
		t.Fatal(err)
	}
	if v := gaugeValue(t, reg, "narad_cluster_connections"); v < 1 {
		t.Fatalf("narad_cluster_connections = %v on a follower of two peers", v)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestForwardSaysWhatWasNotDelivered: meta resends a write only on
// meta.ErrNotDelivered, so Forward must say it exactly when the other node certainly
// did not handle the request: nobody there, or its control plane not open yet.
func TestForwardSaysWhatWasNotDelivered(t *testing.T) {
	a := startPlane(t, "a", secret)
	b := startPlane(t, "b", secret)
	t.Cleanup(func() { a.Close(); b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, err := a.Forward(ctx, raft.ServerAddress(b.Addr()), []byte(`{}`))
	if !errors.Is(err, meta.ErrNotDelivered) {
		t.Fatalf("forward to a node whose control plane is not open: %v, want ErrNotDelivered", err)
	}
	b.Serve(func(ctx context.Context, req []byte) ([]byte, error) { return append([]byte("got "), req...), nil })
	out, err := a.Forward(ctx, raft.ServerAddress(b.Addr()), []byte(`x`))
	if err != nil || string(out) != "got x" {
		t.Fatalf("forward: %q %v", out, err)
	}
	// A handler that does not answer in time: the outcome is unknown.
	b.Serve(func(ctx context.Context, req []byte) ([]byte, error) { <-ctx.Done(); return nil, ctx.Err() })
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = a.Forward(short, raft.ServerAddress(b.Addr()), []byte(`x`))
	cancelShort()
	if err == nil || errors.Is(err, meta.ErrNotDelivered) {
		t.Fatalf("forward to a handler that hangs: %v, want an error of unknown outcome", err)
	}
	// Nobody at the address.
	addr := b.Addr()
	b.Close()
	_, err = a.Forward(ctx, raft.ServerAddress(addr), []byte(`x`))
	if err == nil {
		t.Fatalf("forward to a closed node succeeded")
	}
	// A node of another secret: the handshake fails, so the request never left.
	c := startPlane(t, "c", []byte("another-secret-entirely-000"))
	t.Cleanup(func() { c.Close() })
	_, err = a.Forward(ctx, raft.ServerAddress(c.Addr()), []byte(`x`))
	if !errors.Is(err, meta.ErrNotDelivered) {
		t.Fatalf("forward to a node of another secret: %v, want ErrNotDelivered (it never left)", err)
	}
	if a.Stats().AuthFailures == 0 && c.Stats().AuthFailures == 0 {
		t.Fatalf("no auth failure counted on either side")
	}
}

// TestDataCallToAnOlderNodeIsNotDelivered: a node of a version without the data
// operation refuses it unread (unknown operation). Its caller must learn that nothing
// ran there, so a keyless produce may go to another partition and the client gets
// "unavailable", not "the outcome is unknown".
func TestDataCallToAnOlderNodeIsNotDelivered(t *testing.T) {
	a := startPlane(t, "a", secret)
	t.Cleanup(func() { a.Close() })
	old, err := transport.New(transport.Options{NodeID: "old", ListenAddr: "127.0.0.1:0", Secret: secret, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	old.Handle(OpMeta, func(context.Context, string, []byte) ([]byte, error) { return nil, nil }) // it knows only the control plane
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = old.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = a.Call(ctx, old.Addr(), []byte(`{"kind":"append"}`))
	if !errors.Is(err, meta.ErrNotDelivered) || !strings.Contains(err.Error(), "older") {
		t.Fatalf("a data call to a node without the operation: %v, want ErrNotDelivered naming an older version", err)
	}
}

// TestDataCallFromANonMemberIsRefusedUnrun: OpData is served only to the nodes the
// member check accepts, by the node id each proved in its handshake; a refused node's
// request never reaches the handler, and its caller learns that nothing ran there.
func TestDataCallFromANonMemberIsRefusedUnrun(t *testing.T) {
	holder := startPlane(t, "holder", secret)
	member := startPlane(t, "member", secret)
	removed := startPlane(t, "removed", secret)
	t.Cleanup(func() { holder.Close(); member.Close(); removed.Close() })
	var ran atomic.Int64
	var asked sync.Map
	holder.ServeData(func(ctx context.Context, req []byte) ([]byte, error) {
		ran.Add(1)
		return append([]byte("served "), req...), nil
	}, func(ctx context.Context, node string) error {
		asked.Store(node, true)
		if node != "member" {
			return fmt.Errorf("node %q is not a member", node)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	out, err := member.Call(ctx, holder.Addr(), []byte(`x`))
	if err != nil || string(out) != "served x" {
		t.Fatalf("a member's data call: %q %v", out, err)
	}
	_, err = removed.Call(ctx, holder.Addr(), []byte(`x`))
	if !errors.Is(err, meta.ErrNotDelivered) || !strings.Contains(err.Error(), "not a member") {
		t.Fatalf("a data call from a node that is not a member: %v, want ErrNotDelivered saying why", err)
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once (for the member only)", n)
	}
	if _, ok := asked.Load("removed"); !ok {
		t.Fatalf("the member check was not asked about the node id the caller proved")
	}
}

// TestRaftTransportDoesNotPipeline: the control plane's Raft replicates without
// pipelining. hashicorp/raft's pipelined replication can deadlock a leader's
// replication to a follower that answered an append with Success=false, while
// heartbeats to it go on, so its metadata stops applying until the leadership changes
// (hashicorp/raft issue 612; see newRaftTransport). With pipelining off the leader
// falls back to one AppendEntries at a time, which has no such state.
func TestRaftTransportDoesNotPipeline(t *testing.T) {
	a, b := startPlane(t, "n1", secret), startPlane(t, "n2", secret)
	t.Cleanup(func() { a.Close(); b.Close() })
	p, err := a.RaftTransport().AppendEntriesPipeline("n2", raft.ServerAddress(b.Addr()))
	if err == nil {
		_ = p.Close()
	}
	if !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("the control plane's Raft transport opened a replication pipeline (err %v): pipelined replication can stall a follower for good", err)
	}
}
