package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/meta"
)

// fakePlane joins Brokers in one process: Raft over raft.InmemTransport, the control
// plane's forwarded requests and the data plane's partition steps by calling the other
// Broker's handlers. hook, when set, sees every data request first and may hold it,
// fail it, or run it and drop the answer.
type fakePlane struct {
	t       *testing.T
	mu      sync.Mutex
	trans   map[raft.ServerAddress]*raft.InmemTransport
	brokers map[string]*Broker
	hook    func(ctx context.Context, addr string, req dataReq, deliver func(context.Context) ([]byte, error)) ([]byte, error)
	// refuseMeta, when it returns true for a control-plane request's kind, that request
	// is not delivered.
	refuseMeta func(kind string) bool
	// seeMeta, when set, sees every control-plane request's body first.
	seeMeta func(body []byte)
	// dropMetaReply, when it returns true for a control-plane request's kind, that
	// request is delivered and its answer lost: the caller gets an error.
	dropMetaReply func(kind string) bool
}

func (p *fakePlane) broker(addr string) *Broker {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.brokers[addr]
}

func (p *fakePlane) Forward(ctx context.Context, addr raft.ServerAddress, req []byte) ([]byte, error) {
	b := p.broker(string(addr))
	if b == nil {
		return nil, fmt.Errorf("%w: %s is not open", meta.ErrNotDelivered, addr)
	}
	p.mu.Lock()
	refuse, see, drop := p.refuseMeta, p.seeMeta, p.dropMetaReply
	p.mu.Unlock()
	if see != nil {
		see(req)
	}
	var r struct{ Kind string }
	_ = json.Unmarshal(req, &r)
	if refuse != nil && refuse(r.Kind) {
		return nil, fmt.Errorf("%w: %s refused by the test", meta.ErrNotDelivered, r.Kind)
	}
	resp, err := b.HandleForward(ctx, req)
	if err == nil && drop != nil && drop(r.Kind) {
		return nil, fmt.Errorf("%s: the answer was lost (the test)", r.Kind)
	}
	return resp, err
}

func (p *fakePlane) Call(ctx context.Context, addr string, body []byte) ([]byte, error) {
	b := p.broker(addr)
	if b == nil {
		return nil, fmt.Errorf("%w: %s is not open", meta.ErrNotDelivered, addr)
	}
	deliver := func(ctx context.Context) ([]byte, error) { return b.HandleData(ctx, body) }
	p.mu.Lock()
	hook := p.hook
	p.mu.Unlock()
	if hook != nil {
		var req dataReq
		if err := json.Unmarshal(body, &req); err != nil {
			p.t.Errorf("a data request does not decode: %v", err)
		}
		return hook(ctx, addr, req, deliver)
	}
	return deliver(ctx)
}

func (p *fakePlane) setHook(h func(ctx context.Context, addr string, req dataReq, deliver func(context.Context) ([]byte, error)) ([]byte, error)) {
	p.mu.Lock()
	p.hook = h
	p.mu.Unlock()
}

// startFakeCluster starts n Brokers (n1 at addr1, …) bootstrapped as one cluster and
// returns them once every one is ready.
func startFakeCluster(t *testing.T, n int) (*fakePlane, []*Broker) {
	t.Helper()
	return startFakeClusterAt(t, make([]int, n))
}

// startFakeClusterAt is startFakeCluster with, per node, the highest cluster version it
// offers (0: the highest this binary speaks; 1: as the release before cluster versions).
func startFakeClusterAt(t *testing.T, versionMax []int) (*fakePlane, []*Broker) {
	t.Helper()
	n := len(versionMax)
	p := &fakePlane{t: t, trans: map[raft.ServerAddress]*raft.InmemTransport{}, brokers: map[string]*Broker{}}
	var peers []meta.Peer
	for i := range n {
		peers = append(peers, meta.Peer{ID: fmt.Sprintf("n%d", i+1), Addr: raft.ServerAddress(fmt.Sprintf("addr%d", i+1))})
	}
	bs := make([]*Broker, n)
	for i, pe := range peers {
		_, tr := raft.NewInmemTransportWithTimeout(pe.Addr, 500*time.Millisecond)
		p.mu.Lock()
		for a, o := range p.trans {
			tr.Connect(a, o)
			o.Connect(pe.Addr, tr)
		}
		p.trans[pe.Addr] = tr
		p.mu.Unlock()
		b, err := Open(Options{
			DataDir: t.TempDir(), NodeID: pe.ID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Peers: p,
			Cluster: meta.Cluster{
				Transport: tr, Forwarder: p, Peers: peers, HTTPAddr: "http-" + string(pe.Addr),
				// A second, not less: with 400 ms (a leader lease of 200 ms) a controller
				// starved of its processor on a loaded machine (make test runs packages
				// side by side on two cores) lost its leadership under a topic create,
				// which failed "outcome unknown". It costs the package about 15 s of
				// first elections.
				RaftTimeout: time.Second, HeartbeatInterval: 100 * time.Millisecond,
				SuspectAfter: 5 * time.Second, DeadAfter: 10 * time.Second,
				VersionMax: versionMax[i],
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		p.mu.Lock()
		p.brokers[string(pe.Addr)] = b
		p.mu.Unlock()
		bs[i] = b
	}
	t.Cleanup(func() {
		for _, b := range bs {
			_ = b.Close()
		}
	})
	startAll(t, bs, 60*time.Second)
	// Ready is not yet alive in the controller's eyes: a request forwarded to a member
	// still joining is refused ("not alive (joining)"), which a loaded machine met.
	deadline := time.Now().Add(60 * time.Second)
	for !allAlive(bs, n) {
		if time.Now().After(deadline) {
			t.Fatal("the fake cluster's members were not all alive on every node within 60 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Nor is the cluster version yet the one its members agree on (the controller
	// commits it once all of them reported): before it, a feature of a later version
	// is not in use (a delete without its fence answered at once, which a test that
	// started sooner after the nodes were alive met).
	want := meta.VersionMax
	for _, v := range versionMax {
		if v != 0 {
			want = min(want, v)
		}
	}
	for _, b := range bs {
		for b.meta.ClusterVersion() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s runs cluster version %d, not the %d its members speak, 60 s after the start", b.opts.NodeID, b.meta.ClusterVersion(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return p, bs
}

// startAll starts every broker at once (each waits for the others to form the
// control plane), each within bound, and fails the test if one does not start.
func startAll(t *testing.T, bs []*Broker, bound time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(bs))
	for i, b := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			errs[i] = b.Start(ctx)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// allAlive reports whether every broker counts n members, all alive.
func allAlive(bs []*Broker, n int) bool {
	for _, b := range bs {
		ms := b.meta.Members()
		if len(ms) != n {
			return false
		}
		for _, m := range ms {
			if m.Status != meta.StatusAlive {
				return false
			}
		}
	}
	return true
}

// cutReplication stops the Raft traffic from the controller to node i (both ways) and
// returns the controller's index; undo reconnects them.
func (p *fakePlane) cutReplication(t *testing.T, bs []*Broker, i int) (leader int, undo func()) {
	t.Helper()
	leader = -1
	for k, b := range bs {
		if b.meta.Leader() {
			leader = k
		}
	}
	if leader < 0 || leader == i {
		t.Fatalf("node %d is the controller (or none is): %d", i, leader)
	}
	la, fa := raft.ServerAddress(fmt.Sprintf("addr%d", leader+1)), raft.ServerAddress(fmt.Sprintf("addr%d", i+1))
	p.mu.Lock()
	lt, ft := p.trans[la], p.trans[fa]
	p.mu.Unlock()
	lt.Disconnect(fa)
	ft.Disconnect(la)
	return leader, func() {
		lt.Connect(fa, ft)
		ft.Connect(la, lt)
	}
}

// isolateMeta cuts node i's metadata replication from every other node, so a change of
// controller does not reach it either; undo reconnects.
func (p *fakePlane) isolateMeta(t *testing.T, bs []*Broker, i int) (undo func()) {
	t.Helper()
	me := raft.ServerAddress(fmt.Sprintf("addr%d", i+1))
	p.mu.Lock()
	mt := p.trans[me]
	others := map[raft.ServerAddress]*raft.InmemTransport{}
	for k := range bs {
		if k != i {
			a := raft.ServerAddress(fmt.Sprintf("addr%d", k+1))
			others[a] = p.trans[a]
		}
	}
	p.mu.Unlock()
	for a, ot := range others {
		ot.Disconnect(me)
		mt.Disconnect(a)
	}
	return func() {
		for a, ot := range others {
			ot.Connect(me, mt)
			mt.Connect(a, ot)
		}
	}
}

// holderIndex returns which broker holds partition i of topic name, as the controller
// sees it.
func holderIndex(t *testing.T, bs []*Broker, name string, i int) int {
	t.Helper()
	from := bs[0]
	for _, b := range bs {
		if b.meta.Leader() {
			from = b
		}
	}
	m, err := from.TopicMeta(name)
	if err != nil {
		t.Fatal(err)
	}
	for k, b := range bs {
		if m.Placement[i].Leader == b.NodeID() {
			return k
		}
	}
	t.Fatalf("partition %d of %s is placed on %q, no broker of the test", i, name, m.Placement[i].Leader)
	return -1
}

// pollUntil polls cond until it holds, failing the test after a generous bound.
func pollUntil(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after 30s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
