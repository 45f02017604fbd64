package partition

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/queue"
	"github.com/narad-mq/narad/broker/internal/raftetcd"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

// A power cut differs from kill -9: kill -9 keeps the page cache, so a write the
// process made reaches the disk even if it never synced it. These tests run three
// replicas of two partitions in one process, each node on its own vfs.Mem, over the
// real node plane on loopback, and cut the power of all three at once under load:
// every write not synced is lost on every node. What was answered must survive.

// plSecret is the node plane's shared secret in these tests.
var plSecret = []byte("powerloss-test-secret-0123456789")

// plFS is a node's file system: its vfs.Mem until the power is cut, then nothing. A
// process whose power is cut writes nothing more, but the code of these tests goes on
// running after the cut (it is stopped afterwards), and must not open new files on
// the surviving disk: every call after cut fails. Files opened before it fail by
// themselves (vfs.ErrCrashed).
type plFS struct {
	mem *vfs.Mem
	cut atomic.Bool
}

var errPowerCut = errors.New("the power of this node is cut")

func (f *plFS) live(op, name string) error {
	if f.cut.Load() {
		return &fs.PathError{Op: op, Path: name, Err: errPowerCut}
	}
	return nil
}

func (f *plFS) OpenFile(name string, flag int, perm fs.FileMode) (vfs.File, error) {
	if err := f.live("open", name); err != nil {
		return nil, err
	}
	return f.mem.OpenFile(name, flag, perm)
}

func (f *plFS) Remove(name string) error {
	if err := f.live("remove", name); err != nil {
		return err
	}
	return f.mem.Remove(name)
}

func (f *plFS) Rename(oldname, newname string) error {
	if err := f.live("rename", oldname); err != nil {
		return err
	}
	return f.mem.Rename(oldname, newname)
}

func (f *plFS) Stat(name string) (vfs.FileInfo, error) {
	if err := f.live("stat", name); err != nil {
		return vfs.FileInfo{}, err
	}
	return f.mem.Stat(name)
}

func (f *plFS) ReadDir(dir string) ([]vfs.FileInfo, error) {
	if err := f.live("readdir", dir); err != nil {
		return nil, err
	}
	return f.mem.ReadDir(dir)
}

func (f *plFS) MkdirAll(dir string, perm fs.FileMode) error {
	if err := f.live("mkdir", dir); err != nil {
		return err
	}
	return f.mem.MkdirAll(dir, perm)
}

func (f *plFS) SyncDir(dir string) error {
	if err := f.live("syncdir", dir); err != nil {
		return err
	}
	return f.mem.SyncDir(dir)
}

const plPartitions = 2

// plNode is one node of the test cluster: its disk (kept across power cuts) and what
// runs on it (made again at each start).
type plNode struct {
	id   uint64
	addr string
	mem  *vfs.Mem

	fs    *plFS
	node  *transport.Node
	sg    *vfs.SyncGroup
	host  *raftetcd.Host
	parts [plPartitions]*Partition
}

type plCluster struct {
	t     *testing.T
	peers map[uint64]string
	log   *slog.Logger

	mu    sync.Mutex // guards nodes' running parts as the test swaps them
	nodes []*plNode
}

// plGroup is Group over one raftetcd group, as the broker makes it.
type plGroup struct {
	host *raftetcd.Host
	id   string
}

func (g *plGroup) Propose(ctx context.Context, cmd []byte, submitted func()) (any, error) {
	_, res, err := g.host.ProposeResult(ctx, g.id, cmd, submitted)
	if errors.Is(err, raftetcd.ErrNotLeader) || errors.Is(err, raftetcd.ErrClosed) || errors.Is(err, raftetcd.ErrUnknownGroup) {
		return nil, fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return res, err
}

func (g *plGroup) Confirm(ctx context.Context) error {
	err := g.host.ConfirmLeader(ctx, g.id)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return err
}

func newPLCluster(t *testing.T) *plCluster {
	c := &plCluster{t: t, peers: map[uint64]string{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if testing.Verbose() {
		c.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	// The addresses first: every host names all three peers.
	var nodes []*transport.Node
	for i := range 3 {
		n, err := transport.New(transport.Options{NodeID: fmt.Sprintf("n%d", i+1), ListenAddr: "127.0.0.1:0", Secret: plSecret, Logger: c.log})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		c.peers[uint64(i+1)] = n.Addr()
		c.nodes = append(c.nodes, &plNode{id: uint64(i + 1), addr: n.Addr(), mem: vfs.NewMem()})
	}
	for i, nd := range c.nodes {
		c.start(nd, nodes[i])
	}
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			c.stop(nd)
		}
	})
	return c
}

func plGroupID(k int) string { return "p" + strconv.Itoa(k) }

// start runs nd on its disk: the node plane (node, or a new one at its address), the
// host and both partitions with their groups.
func (c *plCluster) start(nd *plNode, node *transport.Node) {
	t := c.t
	if node == nil {
		var err error
		node, err = transport.New(transport.Options{NodeID: fmt.Sprintf("n%d", nd.id), ListenAddr: nd.addr, Secret: plSecret, Logger: c.log})
		if err != nil {
			t.Fatal(err)
		}
		if err := node.Start(); err != nil {
			t.Fatal(err)
		}
	}
	nd.fs = &plFS{mem: nd.mem}
	nd.node = node
	nd.sg = vfs.NewSyncGroup(vfs.EachFile{})
	host, err := raftetcd.New(raftetcd.Options{
		Node: node, ID: nd.id, Peers: c.peers, Dir: "/data/groups", Sync: nd.sg, FS: nd.fs,
		Store: raftetcd.StoreRaftstore, ParallelAppend: true, AsyncStorageWrites: true, LazyHeartbeats: true, HeartbeatTick: 3,
		Tick: 30 * time.Millisecond, LivenessInterval: 100 * time.Millisecond, LivenessTimeout: time.Second,
		// Small, so that snapshots, compactions and restores happen between the cuts.
		SnapshotEvery: 48, SnapshotKeep: 8,
		Logger: c.log,
	})
	if err != nil {
		t.Fatal(err)
	}
	nd.host = host
	for k := range plPartitions {
		dir := fmt.Sprintf("/data/p%d", k)
		p, err := Open(Options{
			Dir: dir, Index: uint32(k), FS: nd.fs, Syncer: nd.sg, Logger: c.log,
			Queue:       queue.Config{Visibility: 2 * time.Second, MaxInFlight: 100000, MaxAckedAhead: 100000},
			Group:       &plGroup{host: host, id: plGroupID(k)},
			NewCommands: func() bool { return true },
		})
		if err != nil {
			t.Fatalf("node %d, partition %d: %v", nd.id, k, err)
		}
		err = host.OpenGroup(plGroupID(k), raftetcd.GroupConfig{
			Voters: []uint64{1, 2, 3}, Dir: filepath.Join(dir, "raft"), Campaign: nd.id == uint64(k+1),
			Apply:    p.Apply,
			Snapshot: p.SnapshotState,
			Restore: func(ctx context.Context, index uint64, data []byte, sources []uint64) error {
				return p.RestoreSnapshot(ctx, index, data, c.fetch(nd.id, k, sources))
			},
			OnRole: func(lead bool, term uint64) { p.SetRole(lead, term) },
		})
		if err != nil {
			t.Fatalf("node %d, group of partition %d: %v", nd.id, k, err)
		}
		c.mu.Lock()
		nd.parts[k] = p
		c.mu.Unlock()
	}
}

// fetch reads partition k's records from the other replicas, as the data plane's
// replica read does.
func (c *plCluster) fetch(self uint64, k int, sources []uint64) Fetch {
	return func(ctx context.Context, from uint64) ([]segment.Record, error) {
		for _, src := range sources {
			if src == self {
				continue
			}
			p := c.part(src, k)
			if p == nil {
				continue
			}
			if recs, err := p.Read(from, 1000); err == nil && len(recs) > 0 {
				return recs, nil
			}
		}
		return nil, fmt.Errorf("%w: no replica of partition %d holds offset %d", ErrSnapshotSource, k, from)
	}
}

func (c *plCluster) part(id uint64, k int) *Partition {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id-1].parts[k]
}

// leader returns the partition k of the node that leads it, or nil.
func (c *plCluster) leader(k int) *Partition {
	for id := range uint64(3) {
		if p := c.part(id+1, k); p != nil && p.Leading() {
			return p
		}
	}
	return nil
}

// stop stops what runs on nd (after a power cut every write of it fails).
func (c *plCluster) stop(nd *plNode) {
	if nd.host == nil {
		return
	}
	nd.host.Close()
	c.mu.Lock()
	parts := nd.parts
	nd.parts = [plPartitions]*Partition{}
	c.mu.Unlock()
	for _, p := range parts {
		if p != nil {
			_ = p.Close() // after a cut its writes fail; the test judges what the disk kept
		}
	}
	_ = nd.node.Close() // the node is being replaced or the test ends
	nd.sg.Close()
	nd.host = nil
}

// cutPower cuts the power of every node at once: first no node's process can touch
// its disk any more, then every disk drops what was not synced (cutDrop). With
// cutTorn, a file written past its last sync keeps a random part of those writes, as
// a disk that lost power in the middle of writing them would; with cutHoled, each
// replica's message log and settle journal keep all of them but one lost sector
// (later pages reached the disk, an earlier one did not).
func (c *plCluster) cutPower(r *rand.Rand, how cutKind) {
	for _, nd := range c.nodes {
		nd.fs.cut.Store(true)
	}
	replicaFile := func(name string) bool {
		d := filepath.Base(filepath.Dir(name))
		return (d == "log" || d == "journal") && filepath.Ext(name) == ".log"
	}
	for _, nd := range c.nodes {
		switch how {
		case cutTorn:
			nd.mem.CrashTorn(r)
		case cutHoled:
			nd.mem.CrashHoled(r, replicaFile)
		default:
			nd.mem.Crash()
		}
	}
}

// cutKind is what a power cut leaves of the writes not synced.
type cutKind int

const (
	cutDrop cutKind = iota
	cutTorn
	cutHoled
)

// plHistory is what the clients were told, per partition.
type plHistory struct {
	mu        sync.Mutex
	produced  [plPartitions]map[uint64]string    // offset → payload, answered (a 202)
	attempted map[string]bool                    // every payload sent, answered or not
	acked     [plPartitions]map[uint64]time.Time // offset → when its settle was answered (a 204)
	// ackSent holds the offsets whose settle was sent but not answered: a settle of
	// unknown outcome (the power was cut while it committed) may have taken effect.
	ackSent [plPartitions]map[uint64]bool
	// violations found while running: an acked message leased by a consume sent
	// after the ack's answer.
	violations []string
	confirmed  int
}

func newPLHistory() *plHistory {
	h := &plHistory{attempted: map[string]bool{}}
	for k := range plPartitions {
		h.produced[k] = map[uint64]string{}
		h.acked[k] = map[uint64]time.Time{}
		h.ackSent[k] = map[uint64]bool{}
	}
	return h
}

// load runs producers and consumers against the partitions' leaders until stop.
func (c *plCluster) load(h *plHistory, round int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				k := (w + seq) % plPartitions
				p := c.leader(k)
				if p == nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				payload := fmt.Sprintf("r%d-w%d-%d", round, w, seq)
				h.mu.Lock()
				h.attempted[payload] = true
				h.mu.Unlock()
				off, err := p.Append([]segment.Record{{Value: []byte(payload)}})
				if err != nil {
					time.Sleep(2 * time.Millisecond)
					continue
				}
				h.mu.Lock()
				if prev, ok := h.produced[k][off]; ok {
					h.violations = append(h.violations, fmt.Sprintf("partition %d offset %d answered 202 twice: %q then %q", k, off, prev, payload))
				}
				h.produced[k][off] = payload
				h.confirmed++
				h.mu.Unlock()
			}
		}()
	}
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := (w + i) % plPartitions
				p := c.leader(k)
				if p == nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				sent := time.Now()
				ds, err := p.Lease(20, 2*time.Second, 1<<20)
				if err != nil || len(ds) == 0 {
					time.Sleep(2 * time.Millisecond)
					continue
				}
				h.checkDeliveries(k, ds, sent)
				reqs := make([]SettleReq, len(ds))
				for j, d := range ds {
					reqs[j] = SettleReq{Offset: d.Record.Offset, Nonce: d.Nonce}
				}
				h.mu.Lock()
				for _, r := range reqs {
					h.ackSent[k][r.Offset] = true
				}
				h.mu.Unlock()
				errs := p.Settle(reqs)
				answered := time.Now()
				h.mu.Lock()
				for j, e := range errs {
					if e == nil {
						h.acked[k][reqs[j].Offset] = answered
					}
				}
				h.mu.Unlock()
			}
		}()
	}
	return &wg
}

// checkDeliveries records a violation for every delivery of a message whose ack was
// answered before the consume was sent.
func (h *plHistory) checkDeliveries(k int, ds []Delivery, sent time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range ds {
		if at, ok := h.acked[k][d.Record.Offset]; ok && at.Before(sent) {
			h.violations = append(h.violations, fmt.Sprintf("partition %d offset %d (%q) delivered again after its ack was answered", k, d.Record.Offset, d.Record.Value))
		}
	}
}

func (c *plCluster) waitLeaders(what string) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for k := range plPartitions {
		for c.leader(k) == nil {
			if time.Now().After(deadline) {
				c.t.Fatalf("%s: no leader of partition %d within 30 s", what, k)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// check compares the cluster with the history: every answered message at its offset
// on every replica, the replicas' logs equal record for record.
func (c *plCluster) check(h *plHistory, what string) {
	t := c.t
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, v := range h.violations {
		t.Errorf("%s: %s", what, v)
	}
	for k := range plPartitions {
		// Every replica applies what was committed: wait until they agree on the end.
		var ends [3]uint64
		deadline := time.Now().Add(30 * time.Second)
		for {
			for id := range uint64(3) {
				ends[id] = c.part(id+1, k).log.Next()
			}
			if ends[0] == ends[1] && ends[1] == ends[2] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: partition %d's replicas end at %v after 30 s", what, k, ends)
			}
			time.Sleep(20 * time.Millisecond)
		}
		var logs [3][]segment.Record
		for id := range uint64(3) {
			p := c.part(id+1, k)
			for from := uint64(0); from < ends[id]; {
				recs, err := p.Read(from, 1000)
				if err != nil {
					t.Fatalf("%s: reading partition %d of node %d at %d: %v", what, k, id+1, from, err)
				}
				if len(recs) == 0 {
					break
				}
				logs[id] = append(logs[id], recs...)
				from = recs[len(recs)-1].Offset + 1
			}
		}
		got := map[uint64]string{}
		for _, r := range logs[0] {
			got[r.Offset] = string(r.Value)
			if !h.attempted[string(r.Value)] {
				t.Errorf("%s: partition %d offset %d holds %q, which no producer sent", what, k, r.Offset, r.Value)
			}
		}
		for id := 1; id < 3; id++ {
			if len(logs[id]) != len(logs[0]) {
				t.Errorf("%s: partition %d: node %d holds %d records, node 1 %d", what, k, id+1, len(logs[id]), len(logs[0]))
				continue
			}
			for i, r := range logs[id] {
				o := logs[0][i]
				if r.Offset != o.Offset || string(r.Value) != string(o.Value) || r.Timestamp != o.Timestamp {
					t.Errorf("%s: partition %d: node %d holds offset %d %q (ts %d), node 1 offset %d %q (ts %d)", what, k, id+1, r.Offset, r.Value, r.Timestamp, o.Offset, o.Value, o.Timestamp)
					break
				}
			}
		}
		lost := 0
		for off, payload := range h.produced[k] {
			if got[off] != payload {
				if lost < 5 {
					t.Errorf("%s: partition %d offset %d answered 202 for %q; the log holds %q", what, k, off, payload, got[off])
				}
				lost++
			}
		}
		if lost > 0 {
			t.Errorf("%s: partition %d: %d of %d answered messages lost or changed", what, k, lost, len(h.produced[k]))
		}
	}
}

// drain leases every message left, once, and checks none was acked before and every
// answered message was either acked (or its ack sent without an answer: it may have
// taken effect) or is delivered now.
func (c *plCluster) drain(h *plHistory) {
	t := c.t
	t.Helper()
	for k := range plPartitions {
		delivered := map[uint64]bool{}
		quiet := time.Time{}
		deadline := time.Now().Add(60 * time.Second)
		for {
			p := c.leader(k)
			if p == nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			sent := time.Now()
			// Longer than the drain: nothing leased here comes back during it.
			ds, err := p.Lease(100, 5*time.Minute, 4<<20)
			if err != nil {
				if time.Now().After(deadline) {
					t.Fatalf("draining partition %d: %v", k, err)
				}
				time.Sleep(20 * time.Millisecond)
				continue
			}
			h.checkDeliveries(k, ds, sent)
			for _, d := range ds {
				delivered[d.Record.Offset] = true
			}
			if len(ds) > 0 {
				quiet = time.Time{}
				continue
			}
			// Leases of the load's consumers lapse within their visibility (2 s).
			if quiet.IsZero() {
				quiet = time.Now()
			}
			if time.Since(quiet) > 3*time.Second {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("draining partition %d took over 60 s", k)
			}
			time.Sleep(50 * time.Millisecond)
		}
		h.mu.Lock()
		missing := 0
		for off := range h.produced[k] {
			if _, acked := h.acked[k][off]; !acked && !h.ackSent[k][off] && !delivered[off] {
				if missing < 5 {
					t.Errorf("partition %d offset %d (%q) answered 202, was never acked and is not delivered", k, off, h.produced[k][off])
				}
				missing++
			}
		}
		for _, v := range h.violations {
			t.Errorf("drain: %s", v)
		}
		h.violations = nil
		h.mu.Unlock()
		if missing > 0 {
			t.Errorf("partition %d: %d answered messages neither acked nor delivered", k, missing)
		}
	}
}

// TestReplicatedPowerLoss cuts the power of a whole three-node cluster under load,
// several times (the first drops what was not synced, the second tears it, the third
// keeps it with one sector lost in each replica file):
// every message answered 202 is on every replica at its offset after
// the restart, no message answered 204 is delivered again, and every other answered
// message is still delivered. NARAD_POWERLOSS_SEED replays a run's timing.
func TestReplicatedPowerLoss(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("NARAD_POWERLOSS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("NARAD_POWERLOSS_SEED: %v", err)
		}
	}
	t.Logf("seed %d (NARAD_POWERLOSS_SEED=%d replays the cut times)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	c := newPLCluster(t)
	h := newPLHistory()
	const cuts = 3
	for round := range cuts {
		c.waitLeaders(fmt.Sprintf("before cut %d", round+1))
		stop := make(chan struct{})
		wg := c.load(h, round, stop)
		// Run until enough was answered for snapshots to have been taken, then cut at
		// a random moment.
		start := h.count()
		deadline := time.Now().Add(30 * time.Second)
		for h.count() < start+150 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(time.Duration(rng.Intn(400)) * time.Millisecond)
		c.cutPower(rng, cutKind(round%3))
		close(stop)
		for _, nd := range c.nodes {
			c.stop(nd)
		}
		wg.Wait()
		t.Logf("cut %d: %d messages answered 202 so far", round+1, h.count())
		for _, i := range rng.Perm(3) {
			c.start(c.nodes[i], nil)
		}
		c.waitLeaders(fmt.Sprintf("after cut %d", round+1))
		c.check(h, fmt.Sprintf("after cut %d", round+1))
		if t.Failed() {
			t.FailNow()
		}
	}
	if h.count() < cuts*150 {
		t.Fatalf("only %d messages were answered 202 over %d rounds: the load did not run", h.count(), cuts)
	}
	c.drain(h)
}

func (h *plHistory) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.confirmed
}
