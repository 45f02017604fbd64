package raftetcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/transport"
)

var testSecret = []byte("raftetcd-test-secret-0123456789a")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type testNode struct {
	id   uint64
	node *transport.Node
	host *Host
	sg   *vfs.SyncGroup
	down bool
	// opts and groups are what the host was started with: restart starts it again
	// (a new process at the same address, on the same directory).
	opts   Options
	groups int

	mu      sync.Mutex
	applied map[string]int
}

func (n *testNode) appliedIn(g string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.applied[g]
}

func (n *testNode) stop() {
	if n.down {
		return
	}
	n.down = true
	n.host.Close()
	_ = n.node.Close()
	n.sg.Close()
}

// restart starts a stopped node again at its address, on its directory, as a new
// process of the node would.
func (n *testNode) restart(t *testing.T) {
	t.Helper()
	addr := n.opts.Peers[n.id]
	node, err := transport.New(transport.Options{NodeID: fmt.Sprintf("n%d", n.id), ListenAddr: addr, Secret: testSecret, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	fss, err := vfs.NewFSSyncer(n.opts.Dir)
	if err != nil {
		t.Fatal(err)
	}
	n.node, n.sg = node, vfs.NewSyncGroup(fss)
	opts := n.opts
	opts.Node, opts.Sync = node, n.sg
	if n.host, err = New(opts); err != nil {
		t.Fatal(err)
	}
	for g := range n.groups {
		if err := n.host.AddGroup(groupName(g)); err != nil {
			t.Fatal(err)
		}
	}
	n.down = false
}

// testTick is the clock of the tests: an election timeout of 10 ticks is 300 ms.
const testTick = 30 * time.Millisecond

// startCluster starts three nodes on loopback, each hosting groups g000… with every
// node a voter, and stops them when the test ends.
func startCluster(t *testing.T, groups int) []*testNode {
	t.Helper()
	return startClusterWith(t, groups, func(*Options) {})
}

// startClusterWith is startCluster with changes to every node's options.
func startClusterWith(t *testing.T, groups int, tweak func(*Options)) []*testNode {
	t.Helper()
	return startClusterOn(t, groups, tweak, func(int) {})
}

// startClusterOn is startClusterWith calling before(i) before node i's transport
// starts (to set the environment it reads).
func startClusterOn(t *testing.T, groups int, tweak func(*Options), before func(i int)) []*testNode {
	t.Helper()
	return startNodes(t, 3, groups, tweak, before)
}

// startNodes is startClusterOn with n nodes.
func startNodes(t *testing.T, n, groups int, tweak func(*Options), before func(i int)) []*testNode {
	t.Helper()
	ns := make([]*testNode, n)
	peers := map[uint64]string{}
	for i := range ns {
		before(i)
		n, err := transport.New(transport.Options{NodeID: fmt.Sprintf("n%d", i+1), ListenAddr: "127.0.0.1:0", Secret: testSecret, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		ns[i] = &testNode{id: uint64(i + 1), node: n, applied: map[string]int{}}
		peers[uint64(i+1)] = n.Addr()
	}
	for _, tn := range ns {
		dir := t.TempDir()
		fss, err := vfs.NewFSSyncer(dir)
		if err != nil {
			t.Fatal(err)
		}
		tn.sg = vfs.NewSyncGroup(fss)
		opts := Options{Node: tn.node, ID: tn.id, Peers: peers, Dir: dir, Sync: tn.sg,
			Tick: testTick, LivenessInterval: 100 * time.Millisecond, LivenessTimeout: time.Second, Logger: quiet(),
			Apply: func(g string, _ uint64, _ []byte) {
				tn.mu.Lock()
				tn.applied[g]++
				tn.mu.Unlock()
			}}
		tweak(&opts)
		tn.opts, tn.groups = opts, groups
		tn.host, err = New(opts)
		if err != nil {
			t.Fatal(err)
		}
		for g := range groups {
			if err := tn.host.AddGroup(groupName(g)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		for _, n := range ns {
			n.stop()
		}
	})
	return ns
}

// busiest is the node of ns that leads the most groups in ls, and how many.
func busiest(ns []*testNode, ls map[string]*testNode) (*testNode, int) {
	count := map[*testNode]int{}
	for _, n := range ls {
		count[n]++
	}
	victim := ns[0]
	for _, n := range ns {
		if count[n] > count[victim] {
			victim = n
		}
	}
	return victim, count[victim]
}

func groupName(g int) string { return fmt.Sprintf("g%03d", g) }

// poll waits for cond, failing the test with what after bound.
func poll(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", bound, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leaders waits until every live node agrees on a leader, among the live ones, for
// every group, and returns it per group.
func leaders(t *testing.T, ns []*testNode, groups int) map[string]*testNode {
	t.Helper()
	out := map[string]*testNode{}
	poll(t, 20*time.Second, "every group has one leader seen by every node", func() bool {
		for g := range groups {
			var lead uint64
			for _, n := range ns {
				info, _ := n.host.Info(groupName(g))
				if info.Lead == 0 || (lead != 0 && info.Lead != lead) {
					return false
				}
				lead = info.Lead
			}
			found := false
			for _, n := range ns {
				if n.id == lead {
					if info, _ := n.host.Info(groupName(g)); !info.Leader {
						return false
					}
					out[groupName(g)] = n
					found = true
				}
			}
			if !found {
				return false
			}
		}
		return true
	})
	return out
}

func allQuiesced(ns []*testNode, groups int) bool {
	for _, n := range ns {
		for g := range groups {
			if info, _ := n.host.Info(groupName(g)); !info.Quiesced {
				return false
			}
		}
	}
	return true
}

func propose(t *testing.T, n *testNode, g string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	idx, err := n.host.Propose(ctx, g, []byte("m"))
	if err != nil {
		t.Fatalf("propose to %s on n%d: %v", g, n.id, err)
	}
	return idx
}

// caughtUp waits until every node has applied the last entry of each group's leader
// in ls.
func caughtUp(t *testing.T, ns []*testNode, ls map[string]*testNode) {
	t.Helper()
	poll(t, 20*time.Second, "every replica applied its leader's last entry", func() bool {
		for g, lead := range ls {
			li, _ := lead.host.Info(g)
			for _, n := range ns {
				if info, _ := n.host.Info(g); info.Applied < li.Last {
					return false
				}
			}
		}
		return true
	})
}

// settled waits until no raft frame crossed for five ticks: the followers' answers
// to the quiesce heartbeats are lazy and leave with the tick after the groups
// quiesced, which is not idle traffic.
func settled(t *testing.T, ns []*testNode) {
	t.Helper()
	last, since := uint64(0), time.Now()
	poll(t, 10*time.Second, "no raft frame for five ticks", func() bool {
		if b, _ := frames(ns); b != last {
			last, since = b, time.Now()
		}
		return time.Since(since) > 5*testTick
	})
}

func frames(ns []*testNode) (batch, liveness uint64) {
	for _, n := range ns {
		st := n.host.Stats()
		batch += st.BatchCalls
		liveness += st.RPCCalls
	}
	return
}

// TestElectReplicateQuiesce: every group elects a leader, replicates a write to every
// node, then quiesces everywhere, after which only the node-pair liveness calls cross
// the node plane.
func TestElectReplicateQuiesce(t *testing.T) {
	t.Parallel()
	const groups = 20
	// A liveness lapse (a loaded machine missing the 1 s default) makes the groups of
	// the lapsed peer elect, which is not what this test is about: give it room.
	ns := startClusterWith(t, groups, func(o *Options) { o.LivenessTimeout = 3 * time.Second })
	ls := leaders(t, ns, groups)
	for g, n := range ls {
		propose(t, n, g)
	}
	poll(t, 10*time.Second, "every node applied one write per group", func() bool {
		for _, n := range ns {
			for g := range groups {
				if n.appliedIn(groupName(g)) != 1 {
					return false
				}
			}
		}
		return true
	})
	poll(t, 10*time.Second, "every group quiesced on every node", func() bool { return allQuiesced(ns, groups) })
	settled(t, ns)
	// The leaders as the window opens (one may have moved since the writes: elections
	// started together on a loaded machine can end in a second round).
	ls = leaders(t, ns, groups)
	b0, l0 := frames(ns)
	window := 20 * 10 * testTick // 20 election timeouts
	time.Sleep(window)           // the measured idle window, not a wait for a condition
	b1, l1 := frames(ns)
	if b1 != b0 {
		t.Errorf("%d raft frames crossed the node plane in %v of quiesced idle; want none", b1-b0, window)
	}
	if l1 == l0 {
		t.Errorf("no liveness call in %v; the node pairs must keep heart-beating", window)
	}
	if !allQuiesced(ns, groups) {
		t.Error("a group woke up during the idle window")
	}
	for _, n := range ns {
		if all, q := n.host.GroupCounts(); all != groups || q != groups {
			t.Errorf("n%d counts %d groups, %d quiesced; want %d and %d", n.id, all, q, groups, groups)
		}
	}
	for g, n := range ls {
		if info, _ := n.host.Info(g); !info.Leader {
			t.Errorf("%s changed leader while quiesced", g)
		}
	}
}

// TestProposalWakesQuiescedGroup: a write to a quiesced group wakes it, commits on
// every node, and the group quiesces again; a follower refuses proposals.
func TestProposalWakesQuiescedGroup(t *testing.T) {
	t.Parallel()
	const groups = 5
	ns := startCluster(t, groups)
	ls := leaders(t, ns, groups)
	poll(t, 10*time.Second, "every group quiesced on every node", func() bool { return allQuiesced(ns, groups) })
	g := groupName(3)
	leader := ls[g]
	for _, n := range ns {
		if n != leader {
			if _, err := n.host.Propose(context.Background(), g, []byte("x")); !errors.Is(err, ErrNotLeader) {
				t.Fatalf("propose on follower n%d: %v, want ErrNotLeader", n.id, err)
			}
		}
	}
	for i := range 3 {
		propose(t, leader, g)
		poll(t, 10*time.Second, "every node applied the write", func() bool {
			for _, n := range ns {
				if n.appliedIn(g) != i+1 {
					return false
				}
			}
			return true
		})
		poll(t, 10*time.Second, "the group quiesced again", func() bool { return allQuiesced(ns, groups) })
	}
}

// TestFailoverAfterNodeStops: when the node leading quiesced groups stops, the
// survivors notice through liveness, elect new leaders and commit, well inside the
// liveness timeout plus an election timeout.
func TestFailoverAfterNodeStops(t *testing.T) {
	t.Parallel()
	const groups = 20
	ns := startCluster(t, groups)
	ls := leaders(t, ns, groups)
	poll(t, 10*time.Second, "every group quiesced on every node", func() bool { return allQuiesced(ns, groups) })
	victim, _ := busiest(ns, ls)
	var led []string
	for g, n := range ls {
		if n == victim {
			led = append(led, g)
		}
	}
	var survivors []*testNode
	wonBefore := uint64(0)
	lapsesBefore := map[uint64]uint64{}
	for _, n := range ns {
		if n != victim {
			survivors = append(survivors, n)
			wonBefore += n.host.Stats().LeadershipsWon
			poll(t, 10*time.Second, fmt.Sprintf("n%d to see n%d live", n.id, victim.id), func() bool { return n.host.Peers()[victim.id].Live })
			lapsesBefore[n.id] = n.host.Peers()[victim.id].Lapses
		}
	}
	stopped := time.Now()
	victim.stop()
	ls2 := leaders(t, survivors, groups)
	for _, g := range led {
		propose(t, ls2[g], g)
	}
	took := time.Since(stopped)
	// What an operator reads (narad_peer_alive, narad_peer_liveness_lapses_total,
	// narad_replication_forced_campaigns_total, narad_replication_leaderships_won_total):
	// the quiesced groups' election clocks were stopped, so their new leaders came from
	// forced campaigns, and each new leader counts the leadership it won.
	var forced, won uint64
	for _, n := range survivors {
		st := n.host.Stats()
		forced, won = forced+st.ForcedCampaigns, won+st.LeadershipsWon
		// (The survivor that did not campaign may find the victim dead a liveness
		// interval after the other.)
		poll(t, 10*time.Second, fmt.Sprintf("n%d to see n%d dead", n.id, victim.id), func() bool { return !n.host.Peers()[victim.id].Live })
		if pl := n.host.Peers()[victim.id]; pl.Lapses != lapsesBefore[n.id]+1 {
			t.Errorf("after the stop, n%d sees n%d as %+v; want one more lapse than the %d before", n.id, victim.id, pl, lapsesBefore[n.id])
		}
	}
	// (At least one forced campaign: a survivor whose election timeout ran out before
	// the designated one found the leader dead may win a group by an election.)
	if forced == 0 || won-wonBefore < uint64(len(led)) {
		t.Errorf("%d groups lost their leader: the survivors counted %d forced campaigns and %d leaderships won; want at least 1 and %d", len(led), forced, won-wonBefore, len(led))
	}
	t.Logf("%d groups led by n%d: all re-elected and written after %v", len(led), victim.id, took)
	// liveness timeout 1 s + an election round; 10 s leaves room for a loaded machine
	if took > 10*time.Second {
		t.Errorf("failover took %v", took)
	}
}

// TestFailoverAfterAQuickRestart: a node that leads quiet groups and is back at its
// address within the liveness timeout (a crash and a fast restart) must not be taken
// for alive and leading still. Its peers heard it all along, so no liveness timeout
// fires, and the followers of its quiet groups, their election clocks stopped, would
// count it their leader for good while it restarted as a follower. Its liveness answers
// carry a start id: a new one makes the peers act as if it had died.
func TestFailoverAfterAQuickRestart(t *testing.T) {
	t.Parallel()
	const groups = 20
	ns := startCluster(t, groups)
	ls := leaders(t, ns, groups)
	poll(t, 10*time.Second, "every group quiesced on every node", func() bool { return allQuiesced(ns, groups) })
	victim, led := busiest(ns, ls)
	stopped := time.Now()
	victim.stop()
	victim.restart(t)
	ls2 := leaders(t, ns, groups)
	for g, n := range ls2 {
		propose(t, n, g)
	}
	took := time.Since(stopped)
	t.Logf("n%d led %d groups and restarted at once: all led and written after %v", victim.id, led, took)
	for _, n := range ns {
		if n == victim {
			continue
		}
		// Once its first liveness answer after the restart is seen; propose above
		// may have been served before.
		poll(t, 10*time.Second, fmt.Sprintf("n%d counts n%d's restart as a lapse", n.id, victim.id), func() bool {
			pl := n.host.Peers()[victim.id]
			return pl.Live && pl.Lapses >= 1
		})
	}
}

// TestWALReplay: what save wrote comes back in order, a rewritten suffix replaces the
// old one through MemoryStorage semantics, and a torn tail is cut.
func TestWALReplay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fss, err := vfs.NewFSSyncer(dir)
	if err != nil {
		t.Fatal(err)
	}
	sg := vfs.NewSyncGroup(fss)
	defer sg.Close()
	name := filepath.Join(dir, "g.wal")
	w, _, _, err := openWAL(name, sg)
	if err != nil {
		t.Fatal(err)
	}
	e := func(i, term uint64) raftpb.Entry { return raftpb.Entry{Index: i, Term: term, Data: []byte{byte(i)}} }
	if err := w.save(raftpb.HardState{Term: 2, Vote: 1, Commit: 2}, true, []raftpb.Entry{e(2, 2), e(3, 2)}); err != nil {
		t.Fatal(err)
	}
	if err := w.save(raftpb.HardState{Term: 3, Vote: 2, Commit: 2}, true, []raftpb.Entry{e(3, 3)}); err != nil {
		t.Fatal(err)
	}
	end := w.end
	_ = w.close()
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write([]byte{0, 0, 0, 40, 1, 2}) // a torn record
	f.Close()
	w, hs, ents, err := openWAL(name, sg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if hs.Term != 3 || hs.Vote != 2 || hs.Commit != 2 {
		t.Errorf("hard state %+v, want term 3 vote 2 commit 2", hs)
	}
	if len(ents) != 3 || ents[0].Index != 2 || ents[1].Index != 3 || ents[2].Index != 3 || ents[2].Term != 3 {
		t.Errorf("entries %+v, want 2@2, 3@2, 3@3", ents)
	}
	if w.end != end {
		t.Errorf("torn tail not cut: end %d, want %d", w.end, end)
	}
}

// TestWALStoreReplaysARewrittenTail: the store opened on a wal whose tail a new leader
// rewrote holds each index once, in order. (Fed to MemoryStorage in one Append, the
// replay 2@2, 3@2, 3@3 left four positions with index 3 last, and a group applied its
// entry at position 4 as index 3 again and again: make test hung ten minutes on it.)
func TestWALStoreReplaysARewrittenTail(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fss, err := vfs.NewFSSyncer(dir)
	if err != nil {
		t.Fatal(err)
	}
	sg := vfs.NewSyncGroup(fss)
	defer sg.Close()
	w, _, _, err := openWAL(filepath.Join(dir, "g.wal"), sg)
	if err != nil {
		t.Fatal(err)
	}
	e := func(i, term uint64) raftpb.Entry { return raftpb.Entry{Index: i, Term: term, Data: []byte{byte(i)}} }
	for _, ents := range [][]raftpb.Entry{{e(2, 2), e(3, 2), e(4, 2)}, {e(3, 3)}, {e(4, 3)}, {e(2, 4)}, {e(3, 4)}} {
		if err := w.save(raftpb.HardState{}, false, ents); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.save(raftpb.HardState{Term: 4, Commit: 3}, true, nil); err != nil {
		t.Fatal(err)
	}
	_ = w.close()
	st, err := openWALStore(dir, "g", sg, []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	last, _ := st.LastIndex()
	if last != 3 {
		t.Errorf("last index %d, want 3", last)
	}
	ents, err := st.Entries(2, last+1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range ents {
		if want := uint64(2 + i); got.Index != want || got.Term != 4 {
			t.Errorf("position %d holds %d@%d, want %d@4", want, got.Index, got.Term, want)
		}
	}

	// A wal with a hole in its log does not open.
	dir2 := t.TempDir()
	w, _, _, err = openWAL(filepath.Join(dir2, "g.wal"), sg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.save(raftpb.HardState{}, false, []raftpb.Entry{e(2, 2), e(4, 2)}); err != nil {
		t.Fatal(err)
	}
	_ = w.close()
	if st, err := openWALStore(dir2, "g", sg, []uint64{1}); !errors.Is(err, ErrBadMessage) {
		if err == nil {
			_ = st.close()
		}
		t.Fatalf("a wal with entry 4 after entry 2 opened: %v", err)
	}
}

// TestLazyHeartbeatsShareOneFramePerTick: with every group awake (no quiescing), lazy
// heartbeats from all groups to a peer leave in at most one frame per tick, and they
// still hold every group's leader in place.
func TestLazyHeartbeatsShareOneFramePerTick(t *testing.T) {
	t.Parallel()
	const groups = 20
	ns := startClusterWith(t, groups, func(o *Options) { o.NoQuiesce, o.LazyHeartbeats = true, true })
	ls := leaders(t, ns, groups)
	// The elections' appends and commit updates go at once, not with the tick: the
	// window starts when every replica has applied its leader's last entry.
	caughtUp(t, ns, ls)
	var msgs0 uint64
	for _, n := range ns {
		msgs0 += n.host.Stats().BatchItems
	}
	b0, _ := frames(ns)
	start := time.Now()
	time.Sleep(30 * testTick) // the measured window, not a wait for a condition
	b1, _ := frames(ns)
	ticks := uint64(time.Since(start)/testTick) + 2
	var msgs1 uint64
	for _, n := range ns {
		msgs1 += n.host.Stats().BatchItems
	}
	// 3 nodes x 2 peers, one frame per peer per tick at most
	if max := 6 * ticks; b1-b0 > max {
		t.Errorf("%d frames in %d ticks, want at most %d (one per peer per tick)", b1-b0, ticks, max)
	}
	if msgs1-msgs0 < uint64(groups)*2*ticks/4 {
		t.Errorf("only %d messages in %d ticks: awake groups must keep heart-beating", msgs1-msgs0, ticks)
	}
	for g, n := range ls {
		if info, _ := n.host.Info(g); !info.Leader {
			t.Errorf("%s lost its leader with lazy heartbeats", g)
		}
	}
}

// TestCommitIndexRidesWithTheNextFrame: with lazy heartbeats, the append a leader
// sends only to tell a follower of a new commit index waits for the next frame to that
// peer instead of taking one of its own, and the last write's commit still reaches
// every follower, with the tick, when no write follows. In the serial loop one write
// after another cost eight frames before (the entries to each follower, its answer,
// the commit index, its answer) and four now. The broker's loop (asynchronous writes,
// parallel appends) already sent such writes' commit index with the next write's
// entries; there the saving shows only under concurrent writes (docs/performance.md),
// and this checks that the commit index still arrives.
func TestCommitIndexRidesWithTheNextFrame(t *testing.T) {
	t.Parallel()
	for _, broker := range []bool{false, true} {
		t.Run(fmt.Sprintf("broker=%v", broker), func(t *testing.T) {
			// A slow clock, so that the writes rather than the ticks make the frames:
			// each tick may add one frame in each of the four directions between the
			// leader and its followers.
			const tick = 200 * time.Millisecond
			ns := startClusterWith(t, 1, func(o *Options) {
				o.LazyHeartbeats, o.Tick, o.ElectionTick, o.HeartbeatTick = true, tick, 10, 1
				o.LivenessTimeout = 5 * time.Second
				if broker {
					o.Store, o.AsyncStorageWrites, o.ParallelAppend = StoreRaftstore, true, true
				}
			})
			ls := leaders(t, ns, 1)
			g := groupName(0)
			lead := ls[g]
			caughtUp(t, ns, ls)
			const writes = 60
			b0, _ := frames(ns)
			start := time.Now()
			for range writes {
				propose(t, lead, g)
			}
			b1, _ := frames(ns)
			ticks := uint64(time.Since(start)/tick) + 2
			// Measured: 3.9-4 a write (the serial loop sent 7.2-7.9 before).
			if max := 5*writes + 4*ticks; b1-b0 > max {
				t.Errorf("%d frames for %d writes in %d ticks, want at most %d (five a write, four a tick)", b1-b0, writes, ticks, max)
			}
			// Nothing follows the last write: its commit index leaves with a tick.
			caughtUp(t, ns, ls)
			for _, n := range ns {
				if got := n.appliedIn(g); got != writes {
					t.Errorf("n%d applied %d writes, want %d", n.id, got, writes)
				}
			}
		})
	}
}

// TestALoneWriteQuiescesItsLeaderOnce: after a write followed by nothing, the leader
// quiesces once. Its commit index goes to the followers with the tick, just before the
// quiesce heartbeats; their answer to it changes nothing and must not wake the leader
// (it did: every lone write cost a second round of quiesce heartbeats).
func TestALoneWriteQuiescesItsLeaderOnce(t *testing.T) {
	t.Parallel()
	ns := startClusterWith(t, 1, func(o *Options) {
		o.LazyHeartbeats, o.Store, o.AsyncStorageWrites, o.ParallelAppend = true, StoreRaftstore, true, true
		o.LivenessTimeout = 5 * time.Second
	})
	ls := leaders(t, ns, 1)
	g := groupName(0)
	lead := ls[g]
	asleep := func() {
		poll(t, 20*time.Second, "every replica quiesced", func() bool { return allQuiesced(ns, 1) })
		settled(t, ns)
	}
	asleep()
	q0 := lead.host.Stats().Quiesces
	const writes = 10
	for range writes {
		propose(t, lead, g)
		asleep()
	}
	// Measured: 10 on this change, 20 before it (each lone write woke the leader again).
	if got := lead.host.Stats().Quiesces - q0; got > writes*3/2 {
		t.Errorf("the leader quiesced %d times after %d lone writes, want about one a write", got, writes)
	}
}

// TestApplyRefusesAnEntryThatDoesNotFollow: a committed entry handed out of order (a
// log store that is not raft's log) is not applied and stops the group's loop, instead
// of the group applying one index again and again.
func TestApplyRefusesAnEntryThatDoesNotFollow(t *testing.T) {
	t.Parallel()
	var applied []uint64
	g := &group{h: &Host{log: quiet()}, id: "g", applied: 5, cfg: GroupConfig{Apply: func(i uint64, _ []byte) any {
		applied = append(applied, i)
		return nil
	}}}
	data := make([]byte, 9)
	for _, i := range []uint64{5, 4, 7} {
		if g.apply(raftpb.Entry{Index: i, Term: 2, Data: data}) {
			t.Errorf("entry %d after 5 was applied", i)
		}
	}
	if !g.apply(raftpb.Entry{Index: 6, Term: 2, Data: data}) || g.applied != 6 {
		t.Errorf("entry 6 after 5: applied index %d", g.applied)
	}
	if len(applied) != 1 || applied[0] != 6 {
		t.Errorf("the application was handed %v, want [6]", applied)
	}
}

// TestAppendedAgoIsTheArrival: every replica knows when an entry reached its log, in
// the serial and the asynchronous loop alike; the time goes on growing while the entry
// waits (a command that carries a duration counts from there); an entry read back from
// disk at a restart is not known.
func TestAppendedAgoIsTheArrival(t *testing.T) {
	t.Parallel()
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			ns := startClusterWith(t, 1, func(o *Options) { o.Store, o.AsyncStorageWrites = StoreRaftstore, async })
			g := groupName(0)
			lead := leaders(t, ns, 1)[g]
			before := time.Now()
			idx := propose(t, lead, g)
			var follower *testNode
			for _, n := range ns {
				if n != lead {
					follower = n
				}
			}
			poll(t, 10*time.Second, "every replica has the entry", func() bool {
				for _, n := range ns {
					if _, ok := n.host.AppendedAgo(g, idx); !ok {
						return false
					}
				}
				return true
			})
			for _, n := range ns {
				ago, ok := n.host.AppendedAgo(g, idx)
				if !ok || ago < 0 || ago > time.Since(before) {
					t.Fatalf("n%d: the entry proposed %s ago arrived %s ago (known %v)", n.id, time.Since(before), ago, ok)
				}
			}
			first, _ := follower.host.AppendedAgo(g, idx)
			time.Sleep(20 * time.Millisecond) // the time to be counted, not a wait for a condition
			if later, _ := follower.host.AppendedAgo(g, idx); later < first+20*time.Millisecond {
				t.Fatalf("20 ms on, the entry arrived %s ago (was %s)", later, first)
			}
			follower.stop()
			follower.restart(t)
			if ago, ok := follower.host.AppendedAgo(g, idx); ok {
				t.Fatalf("an entry read back from disk counts as arrived %s ago", ago)
			}
		})
	}
}

// TestApplyLogInHandsOverTheTail: a leader whose followers are gone holds a write it
// can never commit. CloseGroup drops it with the group; ApplyLogIn (a forced takeover)
// reads the closed group's log from its files and hands over everything past its
// snapshot, the uncommitted write last.
func TestApplyLogInHandsOverTheTail(t *testing.T) {
	t.Parallel()
	// The store and writes of the broker's groups; an election timeout of 3 s, so that
	// the leader still leads (check-quorum) when the write is proposed.
	ns := startClusterWith(t, 1, func(o *Options) {
		o.Store, o.AsyncStorageWrites, o.ElectionTick = StoreRaftstore, true, 100
	})
	g := groupName(0)
	lead := leaders(t, ns, 1)[g]
	propose(t, lead, g) // committed and applied everywhere
	caughtUp(t, ns, map[string]*testNode{g: lead})
	before := lead.appliedIn(g)
	for _, n := range ns {
		if n != lead {
			n.stop()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err := lead.host.Propose(ctx, g, []byte("tail"))
	cancel()
	if err == nil {
		t.Fatal("a write committed with two of three replicas stopped")
	}
	lead.host.CloseGroup(g)
	if got := lead.appliedIn(g); got != before {
		t.Fatalf("CloseGroup applied %d entries more", got-before)
	}
	var got []string
	n, err := lead.host.ApplyLogIn(filepath.Join(lead.opts.Dir, g), func(_ uint64, data []byte) { got = append(got, string(data)) })
	if err != nil || n != len(got) || len(got) != 2 || got[0] != "m" || got[1] != "tail" {
		t.Fatalf("ApplyLogIn handed over %q (n %d, %v), want [m tail]", got, n, err)
	}
	if n, err := lead.host.ApplyLogIn(filepath.Join(t.TempDir(), "none"), nil); n != 0 || err != nil {
		t.Fatalf("ApplyLogIn of no log: %d, %v", n, err)
	}
}
