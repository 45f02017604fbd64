package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// testNet connects Stores in one process: Raft over raft.InmemTransport, forwarded
// requests by calling the other Store's HandleForward.
type testNet struct {
	t      *testing.T
	mu     sync.Mutex
	trans  map[raft.ServerAddress]*raft.InmemTransport
	stores map[raft.ServerAddress]*Store
	// refuse, when it returns an error for a request kind and target, fails that request.
	refuse func(kind string, addr raft.ServerAddress) error
	// tune, when set, changes each node's Raft configuration (Options.tuneRaft).
	tune func(*raft.Config)
	// cluster, when set, changes each node's Cluster settings after the test defaults.
	cluster func(*Cluster)
	// hang, when it returns a channel for a request kind and target, holds the
	// forwarded request until the caller's context ends (as a killed node's is held
	// until its calls time out) or the channel closes, and fails it.
	hang func(kind string, addr raft.ServerAddress) <-chan struct{}
	// rewrite, when set, changes the answer of a forwarded request of that kind to
	// that target before the caller sees it.
	rewrite func(kind string, addr raft.ServerAddress, answer []byte) []byte
}

func newTestNet(t *testing.T) *testNet {
	return &testNet{t: t, trans: map[raft.ServerAddress]*raft.InmemTransport{}, stores: map[raft.ServerAddress]*Store{}}
}

func (n *testNet) Forward(ctx context.Context, addr raft.ServerAddress, req []byte) ([]byte, error) {
	n.mu.Lock()
	s, refuse, hang := n.stores[addr], n.refuse, n.hang
	n.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("%w: %s unreachable", ErrNotDelivered, addr)
	}
	if hang != nil {
		var r fwdRequest
		_ = json.Unmarshal(req, &r)
		if release := hang(r.Kind, addr); release != nil {
			select {
			case <-ctx.Done():
			case <-release:
			}
			return nil, fmt.Errorf("%w: %s did not answer", ErrUnavailable, addr)
		}
	}
	if refuse != nil {
		var r fwdRequest
		_ = json.Unmarshal(req, &r)
		if err := refuse(r.Kind, addr); err != nil {
			return nil, err
		}
	}
	// As over the node plane, the caller stops waiting when its context ends; the
	// handler runs on in its own goroutine (a caller must never be held by a handler
	// that waits on the receiving node's Raft, as a closing node's heartbeat was).
	type answer struct {
		b   []byte
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		b, err := s.HandleForward(ctx, req)
		ch <- answer{b, err}
	}()
	select {
	case a := <-ch:
		n.mu.Lock()
		rewrite := n.rewrite
		n.mu.Unlock()
		if rewrite != nil && a.err == nil {
			var r fwdRequest
			_ = json.Unmarshal(req, &r)
			a.b = rewrite(r.Kind, addr, a.b)
		}
		return a.b, a.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %s did not answer: %w", ErrUnavailable, addr, ctx.Err())
	}
}

// transport makes addr's transport and connects it both ways with every other one.
func (n *testNet) transport(addr raft.ServerAddress) *raft.InmemTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, tr := raft.NewInmemTransportWithTimeout(addr, 500*time.Millisecond)
	for a, o := range n.trans {
		if a == addr {
			continue
		}
		tr.Connect(a, o)
		o.Connect(addr, tr)
	}
	n.trans[addr] = tr
	return tr
}

func testCluster(c Cluster) Cluster {
	c.RaftTimeout = 400 * time.Millisecond
	c.HeartbeatInterval = 100 * time.Millisecond
	c.SuspectAfter = time.Second
	c.DeadAfter = 2 * time.Second
	return c
}

// open starts node id at addr on dir; register it for forwarded requests.
func (n *testNet) open(dir, id string, addr raft.ServerAddress, c Cluster) (*Store, error) {
	c = testCluster(c)
	if n.cluster != nil {
		n.cluster(&c)
	}
	c.Transport, c.Forwarder, c.HTTPAddr = n.transport(addr), n, "http-"+string(addr)
	s, err := Open(Options{Dir: dir, NodeID: id, Cluster: c, ApplyTimeout: 10 * time.Second, tuneRaft: n.tune})
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.stores[addr] = s
	n.mu.Unlock()
	return s, nil
}

func (n *testNet) close(s *Store) {
	n.mu.Lock()
	delete(n.stores, s.addr)
	n.mu.Unlock()
	if err := s.Close(); err != nil {
		n.t.Errorf("closing %s: %v", s.NodeID(), err)
	}
}

func (n *testNet) closeAll() {
	n.mu.Lock()
	var ss []*Store
	for _, s := range n.stores {
		ss = append(ss, s)
	}
	n.mu.Unlock()
	for _, s := range ss {
		n.close(s)
	}
}

// eventually polls cond until it holds, failing the test after a generous bound.
func eventually(t *testing.T, what string, cond func() error) {
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
		time.Sleep(20 * time.Millisecond)
	}
}

func waitReady(t *testing.T, ss ...*Store) {
	t.Helper()
	for _, s := range ss {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.WaitReady(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", s.NodeID(), err)
		}
	}
}

// controllerOf waits until one of ss is the controller and returns it.
func controllerOf(t *testing.T, ss ...*Store) *Store {
	t.Helper()
	var ctl *Store
	eventually(t, "a controller", func() error {
		if ctl = leaderOf(ss...); ctl == nil {
			return errors.New("none")
		}
		return nil
	})
	return ctl
}

// followerOf returns a node of ss other than ctl (the last one).
func followerOf(ctl *Store, ss ...*Store) *Store {
	var via *Store
	for _, s := range ss {
		if s != ctl {
			via = s
		}
	}
	return via
}

func leaderOf(ss ...*Store) *Store {
	for _, s := range ss {
		if s.Leader() {
			return s
		}
	}
	return nil
}

// startPeers opens n nodes bootstrapped from one peer list.
func startPeers(t *testing.T, net *testNet, dirs []string) []*Store {
	t.Helper()
	var peers []Peer
	for i := range dirs {
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i+1), Addr: raft.ServerAddress(fmt.Sprintf("addr%d", i+1))})
	}
	ss := make([]*Store, len(dirs))
	for i, p := range peers {
		s, err := net.open(dirs[i], p.ID, p.Addr, Cluster{Peers: peers})
		if err != nil {
			t.Fatal(err)
		}
		ss[i] = s
	}
	waitReady(t, ss...)
	return ss
}

func serverIDs(t *testing.T, s *Store) map[string]raft.ServerSuffrage {
	t.Helper()
	conf, err := s.configuration()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]raft.ServerSuffrage{}
	for _, srv := range conf.Servers {
		out[string(srv.ID)] = srv.Suffrage
	}
	return out
}

// membersAre checks s's member records: every listed node alive with its server id.
func membersAre(s *Store, want map[string]string) error {
	ms := s.Members()
	if len(ms) != len(want) {
		return fmt.Errorf("%s knows %d members, want %d: %+v", s.NodeID(), len(ms), len(want), ms)
	}
	for _, m := range ms {
		if sid, ok := want[m.ID]; !ok || sid != m.ServerID || m.Status != StatusAlive || m.HTTPAddr != "http-"+m.ClusterAddr {
			return fmt.Errorf("%s: member %+v, want alive as %s", s.NodeID(), m, sid)
		}
	}
	return nil
}

func TestClusterBootstrapJoinFailoverRestart(t *testing.T) {
	net := newTestNet(t)
	defer net.closeAll()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()}
	ss := startPeers(t, net, dirs[:3])

	// They agree on one cluster id and three alive voting members.
	want := map[string]string{}
	for _, s := range ss {
		want[s.NodeID()] = s.ServerID()
	}
	eventually(t, "cluster id and members agreed", func() error {
		id := ss[0].ClusterID()
		for _, s := range ss {
			if s.ClusterID() == "" || s.ClusterID() != id {
				return fmt.Errorf("cluster ids %q and %q", id, s.ClusterID())
			}
			if err := membersAre(s, want); err != nil {
				return err
			}
		}
		return nil
	})
	clusterID := ss[0].ClusterID()

	// A write on a follower is forwarded; typed errors come back as they are.
	var follower *Store
	for _, s := range ss {
		if !s.Leader() {
			follower = s
		}
	}
	tp, err := follower.CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 6, RetentionMs: 1000}})
	if err != nil || tp.Incarnation == 0 {
		t.Fatalf("create through a follower: %+v %v", tp, err)
	}
	if got, ok := follower.Topic("orders"); !ok || got.Incarnation != tp.Incarnation {
		t.Fatalf("the follower does not read its own write: %+v %v", got, ok)
	}
	if _, err := follower.CreateTopic(Topic{Name: "orders", TopicConfig: TopicConfig{Partitions: 1}}); !errors.Is(err, ErrTopicExists) {
		t.Fatalf("duplicate create through a follower: %v, want ErrTopicExists", err)
	}
	if _, _, err := follower.DeleteTopic("nope", 0); !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("delete of a missing topic through a follower: %v, want ErrTopicNotFound", err)
	}
	var ce *ConflictError
	if _, err := follower.AttachChild("orders", 0, "orders", 0, make([]uint64, 6)); !errors.As(err, &ce) || !strings.Contains(ce.Msg, "own child") {
		t.Fatalf("attach to itself through a follower: %v, want the ConflictError", err)
	}
	if _, err := follower.DeleteUser("nobody"); !errors.Is(err, ErrUserNotFound) {
		t.Fatalf("delete of a missing user through a follower: %v, want ErrUserNotFound", err)
	}
	// Six partitions over three alive members: two each, each leading its own.
	for id, l := range follower.MemberLoads() {
		if l.Held != 2 || l.Led != 2 {
			t.Fatalf("placement: %s holds %d and leads %d, want 2 and 2 (%+v)", id, l.Held, l.Led, follower.MemberLoads())
		}
	}

	// Three more join through any member: two as voters, the sixth as a non-voter.
	for i := 3; i < 6; i++ {
		id, addr := fmt.Sprintf("n%d", i+1), raft.ServerAddress(fmt.Sprintf("addr%d", i+1))
		s, err := net.open(dirs[i], id, addr, Cluster{Join: ss[i%3].addr})
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
		want[id] = s.ServerID()
		waitReady(t, s)
	}
	eventually(t, "six alive members", func() error { return membersAre(ss[0], want) })
	conf := serverIDs(t, leaderOf(ss...))
	voters := 0
	for _, sf := range conf {
		if sf == raft.Voter {
			voters++
		}
	}
	if len(conf) != 6 || voters != 5 || conf[ss[5].ServerID()] != raft.Nonvoter {
		t.Fatalf("configuration %v: want 6 servers, 5 voters, n6 a non-voter", conf)
	}
	if got, _ := ss[5].Topic("orders"); got.Incarnation != tp.Incarnation || ss[5].ClusterID() != clusterID {
		t.Fatalf("the joined non-voter does not hold the metadata: %+v %q", got, ss[5].ClusterID())
	}

	// The controller stops: another takes over within seconds, writes resume, and the
	// old one is marked suspect, then dead.
	old := leaderOf(ss...)
	if old == nil {
		t.Fatal("no controller")
	}
	net.close(old)
	var rest []*Store
	for _, s := range ss {
		if s != old {
			rest = append(rest, s)
		}
	}
	start := time.Now()
	eventually(t, "a new controller", func() error {
		if leaderOf(rest...) == nil {
			return errors.New("none leads")
		}
		return nil
	})
	t.Logf("new controller after %v", time.Since(start))
	if _, err := rest[len(rest)-1].CreateTopic(Topic{Name: "after", TopicConfig: TopicConfig{Partitions: 1}}); err != nil {
		t.Fatalf("a write after the failover: %v", err)
	}
	eventually(t, "the old controller marked dead", func() error {
		m, _ := rest[0].fsm.member(old.NodeID())
		if m.Status != StatusDead {
			return fmt.Errorf("%+v", m)
		}
		return nil
	})

	// Everything survives a restart of every node from its directory.
	net.closeAll()
	var again []*Store
	for i, dir := range dirs {
		s, err := net.open(dir, fmt.Sprintf("n%d", i+1), raft.ServerAddress(fmt.Sprintf("addr%d", i+1)), Cluster{})
		if err != nil {
			t.Fatal(err)
		}
		again = append(again, s)
	}
	waitReady(t, again...)
	for _, s := range again {
		if s.ClusterID() != clusterID || s.ServerID() != want[s.NodeID()] {
			t.Fatalf("%s after restart: cluster %q server %q", s.NodeID(), s.ClusterID(), s.ServerID())
		}
		for _, name := range []string{"orders", "after"} {
			if _, ok := s.Topic(name); !ok {
				t.Fatalf("%s lost topic %s across the restart", s.NodeID(), name)
			}
		}
	}
	eventually(t, "all six alive again", func() error {
		l := leaderOf(again...)
		if l == nil {
			return errors.New("no controller")
		}
		return membersAre(l, want)
	})
}

// deadController starts three nodes with the given lease (0: the test default), and
// tune's settings when set, and makes what is forwarded to the controller hang until
// the test ends; hung signals when a request of kind reaches it. cut then cuts the
// controller's Raft from the others, who elect a new one.
func deadController(t *testing.T, lease time.Duration, kind string, tune ...func(*Cluster)) (net *testNet, old, follower *Store, hung <-chan struct{}, cut func()) {
	net = newTestNet(t)
	net.cluster = func(c *Cluster) {
		if lease > 0 {
			c.SuspectAfter, c.DeadAfter = lease, 2*lease
		}
		for _, f := range tune {
			f(c)
		}
	}
	t.Cleanup(net.closeAll)
	ss := startPeers(t, net, []string{t.TempDir(), t.TempDir(), t.TempDir()})
	old = controllerOf(t, ss...)
	follower = followerOf(old, ss...)
	dead := make(chan struct{})
	t.Cleanup(func() { close(dead) }) // before closeAll (cleanups run last first)
	hanging := make(chan struct{}, 1)
	net.mu.Lock()
	net.hang = func(k string, addr raft.ServerAddress) <-chan struct{} {
		if addr != old.addr {
			return nil
		}
		if k == kind {
			select {
			case hanging <- struct{}{}:
			default:
			}
		}
		return dead
	}
	net.mu.Unlock()
	return net, old, follower, hanging, func() {
		net.mu.Lock()
		defer net.mu.Unlock()
		for _, s := range ss {
			if s != old {
				net.trans[old.addr].Disconnect(s.addr)
				net.trans[s.addr].Disconnect(old.addr)
			}
		}
	}
}

// newControllerAt reports when s's Raft first named a leader other than old (zero
// until then), as Raft observed it.
func newControllerAt(s *Store, old raft.ServerAddress) func() time.Time {
	var mu sync.Mutex
	var at time.Time
	ch := make(chan raft.Observation, 1)
	s.raft.RegisterObserver(raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		if l, ok := o.Data.(raft.LeaderObservation); ok && l.LeaderAddr != "" && l.LeaderAddr != old {
			mu.Lock()
			if at.IsZero() {
				at = time.Now()
			}
			mu.Unlock()
		}
		return false
	}))
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return at
	}
}

// waitKnown waits until knownAt (newControllerAt) reports a time, and returns it.
func waitKnown(t *testing.T, knownAt func() time.Time) time.Time {
	t.Helper()
	eventually(t, "a new controller known to the follower", func() error {
		if knownAt().IsZero() {
			return errors.New("none yet")
		}
		return nil
	})
	return knownAt()
}
