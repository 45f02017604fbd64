package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/narad-mq/narad/broker/internal/cluster"
	"github.com/narad-mq/narad/broker/internal/meta"
)

// restartableCluster is startReplCluster's cluster with nodes a test can stop and
// start again on their data directories and addresses (a process restart).
type restartableCluster struct {
	t      *testing.T
	secret []byte
	logger *slog.Logger
	peers  []meta.Peer
	dirs   []string
	addrs  []string
	mu     sync.Mutex
	bs     []*Broker
	planes []*cluster.Plane
}

func startRestartableCluster(t *testing.T, n int) *restartableCluster {
	t.Helper()
	c := &restartableCluster{t: t, secret: []byte("replicated-cluster-test-secret-0"),
		logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		bs:     make([]*Broker, n), planes: make([]*cluster.Plane, n)}
	if os.Getenv("NARAD_TEST_LOG") != "" {
		c.logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	for i := range n {
		p, err := cluster.Start(cluster.Options{NodeID: fmt.Sprintf("n%d", i+1), ListenAddr: "127.0.0.1:0", Secret: c.secret, Logger: c.logger})
		if err != nil {
			t.Fatal(err)
		}
		c.planes[i] = p
		c.addrs = append(c.addrs, p.Addr())
		c.dirs = append(c.dirs, t.TempDir())
		c.peers = append(c.peers, meta.Peer{ID: fmt.Sprintf("n%d", i+1), Addr: raft.ServerAddress(p.Addr())})
	}
	for i := range n {
		c.bs[i] = c.open(i)
	}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		var wg sync.WaitGroup
		for _, b := range c.bs {
			if b != nil {
				wg.Add(1)
				go func() { defer wg.Done(); _ = b.Close() }()
			}
		}
		wg.Wait()
		for _, p := range c.planes {
			if p != nil {
				_ = p.Close()
			}
		}
	})
	startAll(t, c.bs, 90*time.Second)
	waitOrFail(t, 60*time.Second, "every member alive at the highest version", func() error {
		if !allAlive(c.bs, n) || !sameVersion(c.bs, meta.VersionMax) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	return c
}

// open opens node i's broker on its plane (not started).
func (c *restartableCluster) open(i int) *Broker {
	c.t.Helper()
	p := c.planes[i]
	b, err := Open(Options{
		DataDir: c.dirs[i], NodeID: fmt.Sprintf("n%d", i+1), Logger: c.logger.With("node", fmt.Sprintf("n%d", i+1)),
		Peers: p, Node: p.Node(),
		Cluster: meta.Cluster{
			Transport: p.RaftTransport(), LocalAddr: raft.ServerAddress(p.Addr()), Forwarder: p,
			Peers: c.peers, HTTPAddr: fmt.Sprintf("127.0.0.1:%d", 1+i),
			MaxMoves: 2,
		},
	})
	if err != nil {
		c.t.Fatal(err)
	}
	p.Serve(b.HandleForward)
	p.ServeData(b.HandleData, b.CheckPeer)
	return b
}

// stop stops node i as a process stops.
func (c *restartableCluster) stop(i int) {
	c.t.Helper()
	c.mu.Lock()
	b, p := c.bs[i], c.planes[i]
	c.bs[i], c.planes[i] = nil, nil
	c.mu.Unlock()
	_ = b.Close()
	_ = p.Close()
}

// start starts node i again, stopped before, on its data directory and address.
func (c *restartableCluster) start(i int) *Broker {
	c.t.Helper()
	var p *cluster.Plane
	waitOrFail(c.t, 10*time.Second, "the node plane binds its address again", func() error {
		var err error
		p, err = cluster.Start(cluster.Options{NodeID: fmt.Sprintf("n%d", i+1), ListenAddr: c.addrs[i], Secret: c.secret, Logger: c.logger})
		return err
	})
	c.mu.Lock()
	c.planes[i] = p
	c.mu.Unlock()
	b := c.open(i)
	c.mu.Lock()
	c.bs[i] = b
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		c.t.Fatal(err)
	}
	return b
}

// TestASourceRestartedWhileItsMoveSwitchesOpensItsReplica: a move's switch committed
// the new replica set, and the source went down (a crash, a rolling restart) before
// the partition's group followed it. The group's joint change needs the old set's
// majority too, which for a partition of two replicas is both: the source must take
// part again when it comes back (moves.md: "the source stays open while the move is
// switching: the group may still count it"). On the old code the restarted source did
// not open a replica its placement no longer names, so the group had no majority for
// good: the partition took no produce, and the move stayed switching.
func TestASourceRestartedWhileItsMoveSwitchesOpensItsReplica(t *testing.T) {
	t.Parallel()
	c := startRestartableCluster(t, 3)
	ctx := context.Background()
	bs := c.bs
	tm, err := bs[0].CreateTopic(ctx, TopicSpec{Name: "sw", Partitions: ptr[int32](1), ReplicationFactor: ptr[int32](2)})
	if err != nil {
		t.Fatal(err)
	}
	waitOrFail(t, 30*time.Second, "a first produce", func() error {
		_, err := bs[0].Produce(ctx, "sw", []Outgoing{{Partition: 0, Value: []byte("before")}})
		return err
	})
	li := -1
	waitOrFail(t, 30*time.Second, "a leader", func() error {
		if li = leaderIndex(bs, "sw", 0); li < 0 {
			return fmt.Errorf("none")
		}
		return nil
	})
	reps := tm.Placement[0].Replicas
	si, ti := -1, -1
	for k, b := range bs {
		switch {
		case !slices.Contains(reps, b.NodeID()):
			ti = k
		case k != li:
			si = k
		}
	}
	if si < 0 || ti < 0 {
		t.Fatalf("replicas %v, leader %s", reps, bs[li].NodeID())
	}
	// The source goes down; the move starts, and its switch commits (as the leader
	// commits it once the learner caught up) before the group followed it. With the
	// source down the group of two changes nothing, so this order holds the window
	// open for the test.
	src := bs[si].NodeID()
	c.stop(si)
	t.Logf("stopped the source %s", src)
	var mv meta.Move
	waitOrFail(t, 30*time.Second, "the move starts", func() error {
		var err error
		mv, err = bs[li].meta.StartMove(meta.Move{Topic: "sw", Incarnation: tm.Incarnation, Partition: 0, From: src, To: bs[ti].NodeID(), Cause: meta.CauseRequest})
		return err // the stopped node may have been the controller
	})
	waitOrFail(t, 30*time.Second, "the move switches", func() error {
		_, err := bs[li].meta.SwitchMove(mv.ID)
		return err
	})
	c.start(si)
	t.Logf("started the source %s again", src)
	waitOrFail(t, 60*time.Second, "the move ends", func() error {
		m, _ := bs[li].meta.Move(mv.ID)
		if m.Status != meta.MoveDone {
			return fmt.Errorf("move %d is %s", mv.ID, m.Status)
		}
		return nil
	})
	waitOrFail(t, 30*time.Second, "a produce after the move", func() error {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := bs[ti].Produce(pctx, "sw", []Outgoing{{Partition: 0, Value: []byte("after")}})
		return err
	})
}

// TestAFailedMovesTargetThatWasDownDeletesItsCopy: the controller fails a copying move
// whose target died (and a cancel ends one as well); the target's copy never voted and
// is deleted (moves.md). A target that was down when the move ended, and so does not
// open the replica its placement no longer names when it starts again, kept its copy
// for good on the old code: only a move's source was looked for among the replicas not
// opened (removeUnopened), and each start logged the copy as an orphan.
func TestAFailedMovesTargetThatWasDownDeletesItsCopy(t *testing.T) {
	t.Parallel()
	c := startRestartableCluster(t, 5)
	ctx := context.Background()
	bs := c.bs
	tm, err := bs[0].CreateTopic(ctx, TopicSpec{Name: "fl", Partitions: ptr[int32](1), ReplicationFactor: ptr[int32](2)})
	if err != nil {
		t.Fatal(err)
	}
	waitOrFail(t, 30*time.Second, "a first produce", func() error {
		_, err := bs[0].Produce(ctx, "fl", []Outgoing{{Partition: 0, Value: []byte("before")}})
		return err
	})
	reps := tm.Placement[0].Replicas
	idx := func(id string) int {
		for k, b := range bs {
			if b != nil && b.NodeID() == id {
				return k
			}
		}
		return -1
	}
	ti := -1
	for k, b := range bs {
		if !slices.Contains(reps, b.NodeID()) {
			ti = k
		}
	}
	oi := -1 // a node that stays up
	for k, b := range bs {
		if k != ti && !slices.Contains(reps, b.NodeID()) {
			oi = k
		}
	}
	// One replica down: the group of two changes nothing (its learner is never added,
	// so the move cannot switch), which holds the move copying for the test.
	bi := idx(reps[1])
	c.stop(bi)
	var mv meta.Move
	waitOrFail(t, 30*time.Second, "the move starts", func() error {
		var err error
		mv, err = bs[oi].meta.StartMove(meta.Move{Topic: "fl", Incarnation: tm.Incarnation, Partition: 0, From: reps[0], To: bs[ti].NodeID(), Cause: meta.CauseRequest})
		return err // the stopped node may have been the controller
	})
	var dir string
	waitOrFail(t, 30*time.Second, "the target opens its copy", func() error {
		lt, err := bs[ti].lookup("fl")
		if err != nil {
			return err
		}
		if lt.parts()[0] == nil {
			return fmt.Errorf("not open")
		}
		dir = bs[ti].partDir(lt, 0)
		return nil
	})
	c.stop(ti)
	// As the controller fails a copying move whose target is dead.
	waitOrFail(t, 30*time.Second, "the move failed", func() error {
		_, err := bs[oi].meta.SetMoveStatus(mv.ID, meta.MoveFailed, "the target node is down or leaving")
		return err // the stopped node may have been the controller
	})
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the target's copy is not on disk while it is down: %v", err)
	}
	c.start(bi)
	c.start(ti)
	waitOrFail(t, 30*time.Second, "the target deletes the copy of the failed move", func() error {
		if _, err := os.Stat(dir); err == nil {
			return fmt.Errorf("%s is still there", dir)
		}
		return nil
	})
}
