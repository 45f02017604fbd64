package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/narad-mq/narad/verify/history"
	"github.com/narad-mq/narad/verify/netns"
	"github.com/narad-mq/narad/verify/node"
)

// faulter is what hurts the node(s) during the load: the single node's injector or the
// cluster's.
type faulter interface {
	run(ctx context.Context) error
	ensureUp(ctx context.Context, mayArm bool) error
	recordSkips()
}

// Cluster fault kinds (the history's fault lines use history.Fault* for the acts: kill,
// pause, wipe, netcut, restart; these name the planned steps).
const (
	StepLeaderKill     = "leader-kill"     // kill -9 the leader of a partition, restart it
	StepControllerKill = "controller-kill" // kill -9 the control plane's leader, restart it
	StepNodeKill       = "node-kill"       // kill -9 any node, restart it
	StepDoubleFailover = "double-failover" // kill a leader, then its successor as soon as it leads; restart both
	StepPause          = "pause"           // SIGSTOP a partition leader past the election timeout, SIGCONT
	StepWipe           = "wipe"            // kill -9 a node, delete its data directory, restart it empty
	StepKillAll        = "kill-all"        // kill -9 every node within 10 ms, restart them in random order
	StepNetCut         = "netcut"          // cut a leader's node plane both ways (chaosnet, or iptables in a namespace)
	StepNetDeaf        = "netdeaf"         // a leader sends but hears nothing (chaosnet, or iptables in a namespace)
	StepNetMute        = "netmute"         // a leader hears but its packets are lost (chaosnet, or iptables in a namespace)
	StepNetLossy       = "netlossy"        // every node loses 5 % of its packets (chaosnet, or iptables in a namespace)
	StepNetSlow        = "netslow"         // every node's packets are held 20–180 ms (so reordered) and 5 % sent twice (chaosnet only: the kernel here has no netem)
	StepNetSplit       = "netsplit"        // a leader and fewer than half of the others cut from the rest, both ways; each side talks within itself
	StepCorrupt        = "corrupt"         // kill -9 a node, damage one of its replicas' files (a bit flip in an acknowledged record, a torn tail), restart it
	StepClock          = "clock"           // kill -9 a node, restart it with its wall clock 2–20 s ahead or behind the others' for the rest of the run
	StepRolling        = "rolling-restart" // stop every node with SIGTERM and start it again, one at a time, each back and the cluster healthy before the next
	StepDisk           = "disk"            // kill -9 a node, start it with one segment write failing (EIO or ENOSPC) or slow (1.5 s), keep it running 10 s, then kill and restart it
	StepFailpoint      = "failpoint-kill"  // kill -9 a node, start it armed to kill itself at a named point of its storage (a replica's append or settle applied, a segment write), then again unarmed
	StepWALFail        = "walfail"         // kill -9 a node, start it with its write-ahead file's N-th round failing (EIO): it must stop at once with exit status 74 (fail-stop); restart it
	StepSlowDisk       = "slowdisk"        // a partition leader's disk turns slow (every write-ahead sync 1.5 s, through its failpoints file) for 15 s, then quick again: it must hand its partitions over; nothing is lost
	StepMove           = "move"            // move a partition's replica (its leader's too) to a node that holds none, under load; five times in six kill -9 a party of it (controller, source or target, or the leader twice as often) while it copies or switches; wait until it ends
)

// ClusterSteps lists every step kind.
var ClusterSteps = []string{StepLeaderKill, StepControllerKill, StepNodeKill, StepDoubleFailover, StepPause, StepWipe, StepKillAll,
	StepNetCut, StepNetDeaf, StepNetMute, StepNetLossy, StepNetSlow, StepNetSplit, StepCorrupt, StepClock, StepRolling, StepFailpoint, StepDisk, StepWALFail, StepSlowDisk, StepMove}

// ParseSteps reads "kind=count,..." (an empty string: no steps).
func ParseSteps(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 || !slices.Contains(ClusterSteps, k) {
			return nil, fmt.Errorf("fault steps: %q is not kind=count with a kind of %s", kv, strings.Join(ClusterSteps, ", "))
		}
		out[k] = n
	}
	return out, nil
}

// ClusterFaultConfig is the cluster's fault schedule: how many of each step. The steps
// are put in an order drawn from the seed, so a seed repeats the schedule (the kinds,
// their order, which partition's leader, the gaps and durations); which node that is
// depends on who leads at the time.
type ClusterFaultConfig struct {
	Steps map[string]int
	// MinGap and MaxGap bound the time between two steps (after the cluster is healthy
	// again: every node ready, every partition led, every follower caught up).
	MinGap, MaxGap time.Duration
	// PauseFor is how long a SIGSTOP lasts (past the 1–2 s election timeout); NetFor how
	// long a network fault lasts.
	PauseFor, NetFor time.Duration
	// ChaosNet is the node-plane rules file of each node (by id), polled by a narad built
	// with -tags chaosnet (NARAD_CHAOSNET_FILE); required by the net steps.
	ChaosNet map[string]string
	// Failpoints is the failpoints file of each node (by id), polled by a narad built
	// with -tags failpoints (NARAD_FAILPOINTS_FILE); required by the slowdisk step.
	Failpoints map[string]string
	// PlaneAddrs is each node's cluster (node-plane) address, by id: what a netsplit's
	// chaosnet rules name.
	PlaneAddrs map[string]string
	// Netns, when the nodes run in network namespaces of their own, makes the net
	// steps' drops with iptables there (netslow stays chaosnet's).
	Netns *netns.Net
	// ClockOffsets shifts nodes' wall clocks (by id) from their first start on, through
	// the failpoints build's clock seam; a clock step changes one later.
	ClockOffsets map[string]time.Duration
	// ClockDrifts makes nodes' wall clocks (by id) gain that many seconds a second from
	// their first start on, across restarts (a clock step may set another).
	ClockDrifts map[string]float64
	// FirstStartDrift is how far the machine's wall clock had moved against the
	// monotonic clock since the run's clock started when the nodes first started (the
	// runner sets it and writes it into their first clock lines): part of every node's
	// offset until it restarts.
	FirstStartDrift time.Duration
	// Repeat runs the schedule again (in a new order) until the producers are done: a
	// soak's faults for as long as it lasts.
	Repeat bool
}

// Kills counts the steps' kill -9s (a double failover kills two nodes, a kill-all all).
func (c ClusterFaultConfig) Kills(nodes int) int {
	s := c.Steps
	// Five moves in six kill a party of theirs (an estimate: the party is drawn).
	return s[StepLeaderKill] + s[StepControllerKill] + s[StepNodeKill] + 2*s[StepDoubleFailover] + s[StepWipe] + s[StepCorrupt] + s[StepClock] + nodes*s[StepKillAll] + 2*s[StepFailpoint] + 2*s[StepDisk] + s[StepWALFail] + 5*s[StepMove]/6
}

// Schedule returns the steps in the order a seed gives them.
func (c ClusterFaultConfig) Schedule(rng *rand.Rand) []string {
	var kinds []string
	for k := range c.Steps {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds) // map order is random; the seed must decide alone
	var out []string
	for _, k := range kinds {
		for i := 0; i < c.Steps[k]; i++ {
			out = append(out, k)
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

type clusterInjector struct {
	w     *run
	cfg   ClusterFaultConfig
	rng   *rand.Rand
	byID  map[string]*node.Node
	c     *client
	mu    sync.Mutex
	taken map[string]bool // nodes down or hurt by a step (not crashes)
	// clock is each node's wall clock (StepClock), given to every start of it.
	clock map[string]nodeClock
	// recorded is the offset against the run's clock each node's last clock line
	// gave it (with the machine's own drift at its start: start).
	recorded map[string]time.Duration
	// wallDrift measures how far the machine's wall clock has moved against the
	// monotonic clock since the run began (Clock.WallDrift; tests replace it).
	wallDrift func() time.Duration
	// perm is the step's order of restarts, drawn with its other choices.
	perm []int
}

// restartOrder orders n nodes by the step's permutation.
func (in *clusterInjector) restartOrder(n int) []int {
	var out []int
	for _, k := range in.perm {
		if k < n {
			out = append(out, k)
		}
	}
	return out
}

func (in *clusterInjector) now() int64 { return in.w.clk.Now() }

func (in *clusterInjector) fault(kind string, start, end int64, target, detail string) {
	in.w.rec.Add(history.Entry{Kind: history.KindFault, Fault: kind, Call: start, Return: end, Target: target, Detail: detail, Partition: -1, Offset: -1})
	in.w.mu.Lock()
	in.w.stats.Faults[kind]++
	in.w.mu.Unlock()
}

func (in *clusterInjector) note(format string, args ...any) {
	in.w.mu.Lock()
	in.w.stats.Notes = append(in.w.stats.Notes, fmt.Sprintf(format, args...))
	in.w.mu.Unlock()
}

func (in *clusterInjector) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (in *clusterInjector) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(in.rng.Int63n(int64(hi-lo)))
}

func (in *clusterInjector) init() {
	in.byID = map[string]*node.Node{}
	for _, n := range in.w.nodes {
		in.byID[n.ID()] = n
	}
	in.taken = map[string]bool{}
	in.clock = map[string]nodeClock{}
	in.recorded = map[string]time.Duration{}
	for _, n := range in.w.nodes {
		// The runner's line for the first start, or none when this is 0.
		in.recorded[n.ID()] = in.cfg.ClockOffsets[n.ID()] + in.cfg.FirstStartDrift
	}
	for id, off := range in.cfg.ClockOffsets {
		in.clock[id] = nodeClock{off: off}
	}
	if in.wallDrift == nil {
		in.wallDrift = in.w.clk.WallDrift
	}
	for id, d := range in.cfg.ClockDrifts {
		c := in.clock[id]
		c.drift = d // since 0: the nodes' first starts, at the run's start
		in.clock[id] = c
	}
	in.c = newClient("injector", in.w.eps, in.w.rec, in.w.clk)
	if in.cfg.PauseFor == 0 {
		in.cfg.PauseFor = 3 * time.Second
	}
	if in.cfg.NetFor == 0 {
		in.cfg.NetFor = 4 * time.Second
	}
}

// run plays the schedule, one step after the other, each once the cluster is healthy,
// and then waits for the producers.
func (in *clusterInjector) run(ctx context.Context) error {
	in.init()
	steps := in.cfg.Schedule(in.rng)
	for i := 0; i < len(steps); i++ {
		step := steps[i]
		if !in.sleep(ctx, in.between(in.cfg.MinGap, in.cfg.MaxGap)) {
			return ctx.Err()
		}
		in.crashes()
		if !in.healthy(ctx, 60*time.Second) {
			in.note("before step %d (%s) the cluster was not healthy within 60 s; going on", i+1, step)
		}
		// The random choices of a step are drawn before it acts, so a seed's schedule
		// does not depend on what the cluster answered.
		pick, d1, d2 := in.rng.Intn(1<<30), in.between(300*time.Millisecond, 2*time.Second), in.between(0, 300*time.Millisecond)
		in.perm = in.rng.Perm(len(in.w.nodes))
		if err := in.step(ctx, step, pick, d1, d2); err != nil {
			return err
		}
		if i == len(steps)-1 && in.cfg.Repeat && !in.w.prodDone.Load() {
			steps = append(steps, in.cfg.Schedule(in.rng)...)
		}
	}
	for !in.w.prodDone.Load() {
		in.crashes()
		if !in.sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return ctx.Err()
}

// step does one planned fault. pick chooses the partition (or node), down how long a
// killed node stays down, jitter the gaps of a restart in random order.
func (in *clusterInjector) step(ctx context.Context, step string, pick int, down, jitter time.Duration) error {
	switch step {
	case StepLeaderKill, StepPause, StepNetCut, StepNetDeaf, StepNetMute, StepNetSplit, StepSlowDisk:
		topic, p := in.partition(pick)
		id := in.leaderOf(ctx, topic, p, "")
		if id == "" {
			in.note("%s: no leader of %s/%d found; skipped", step, topic, p)
			return nil
		}
		role := fmt.Sprintf("leader of %s/%d", topic, p)
		switch step {
		case StepSlowDisk:
			in.slowDisk(ctx, id, role, topic, p)
		case StepLeaderKill:
			return in.killRestart(ctx, id, role, down)
		case StepPause:
			in.pause(id, role)
		default:
			in.net(ctx, step, id, role, topic, p)
		}
	case StepNetLossy, StepNetSlow:
		in.net(ctx, step, "", "every node", "", 0)
	case StepControllerKill:
		id := in.controller(ctx)
		if id == "" {
			in.note("%s: no controller found; skipped", step)
			return nil
		}
		return in.killRestart(ctx, id, "controller", down)
	case StepNodeKill:
		return in.killRestart(ctx, in.w.nodes[pick%len(in.w.nodes)].ID(), "any node", down)
	case StepWipe:
		n := in.w.nodes[pick%len(in.w.nodes)]
		in.kill(n, "to wipe its data directory")
		t0 := in.now()
		if err := n.Wipe(); err != nil {
			return fmt.Errorf("wiping %s: %w", n.ID(), err)
		}
		in.fault(history.FaultWipe, t0, in.now(), n.ID(), "data directory deleted")
		in.sleep(ctx, down)
		return in.restart(ctx, n)
	case StepCorrupt:
		n := in.w.nodes[pick%len(in.w.nodes)]
		in.kill(n, "to damage its files")
		t0 := in.now()
		if rel, detail := damageReplica(in.rng, n.DataDir()); rel != "" {
			// No FaultDamaged line: the other replicas hold intact copies, so the damage
			// excuses nothing (the single node's skip rule does not apply).
			in.fault(history.FaultCorrupt, t0, in.now(), n.ID(), rel+": "+detail)
		} else {
			in.note("%s: %s holds no file to damage yet; restarted as is", step, n.ID())
		}
		in.sleep(ctx, down)
		return in.restart(ctx, n)
	case StepClock:
		n := in.w.nodes[pick%len(in.w.nodes)]
		off := time.Duration(2+in.rng.Intn(19)) * time.Second
		if in.rng.Intn(2) == 0 {
			off = -off
		}
		// Every other step also makes the clock run 1–4 % fast or slow from then on.
		var drift float64
		if in.rng.Intn(2) == 0 {
			drift = float64(1+in.rng.Intn(4)) / 100
			if in.rng.Intn(2) == 0 {
				drift = -drift
			}
		}
		in.kill(n, "to restart it with a shifted wall clock")
		t := in.now()
		in.mu.Lock()
		in.clock[n.ID()] = nodeClock{off: off, drift: drift, since: t}
		if drift == 0 {
			in.recorded[n.ID()] = off // the line below (start adds the machine's drift)
		}
		in.mu.Unlock()
		if drift == 0 {
			// Written before the node starts, so the node ran with it from the line on
			// (a drifting clock's line is written by each start: start).
			in.w.rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultClock, Call: t, Return: t, Target: n.ID(),
				Detail: fmt.Sprintf("%s's wall clock %s against the others'", n.ID(), fmtStep(off)), ClockOffset: int64(off), Partition: -1, Offset: -1})
		}
		in.w.mu.Lock()
		in.w.stats.Faults[history.FaultClock]++
		in.w.mu.Unlock()
		in.sleep(ctx, down)
		return in.restart(ctx, n)
	case StepDoubleFailover:
		topic, p := in.partition(pick)
		first := in.leaderOf(ctx, topic, p, "")
		if first == "" {
			in.note("%s: no leader of %s/%d found; skipped", step, topic, p)
			return nil
		}
		in.kill(in.byID[first], fmt.Sprintf("leader of %s/%d (double failover, first)", topic, p))
		second := in.leaderOf(ctx, topic, p, first)
		if second != "" {
			in.kill(in.byID[second], fmt.Sprintf("leader of %s/%d (double failover, second: the first one's successor)", topic, p))
		} else {
			in.note("%s: no successor of %s led %s/%d within the bound; one kill only", step, first, topic, p)
		}
		// Both come back together, as after a power cut of two racks.
		var down []*node.Node
		for _, id := range []string{first, second} {
			if id != "" {
				down = append(down, in.byID[id])
			}
		}
		return in.restartAll(ctx, down, in.restartOrder(len(down)), jitter, "double failover")
	case StepKillAll:
		return in.killAll(ctx, jitter)
	case StepMove:
		return in.move(ctx, pick, down)
	case StepRolling:
		return in.rolling(ctx)
	case StepDisk:
		n := in.w.nodes[pick%len(in.w.nodes)]
		action := []string{"eio", "enospc", "sleep(1500ms)"}[(pick/len(in.w.nodes))%3]
		at := 5 + (pick>>10)%100
		in.kill(n, "to start it with a failing disk")
		in.sleep(ctx, down)
		return in.diskFault(ctx, n, action, at)
	case StepWALFail:
		n := in.w.nodes[pick%len(in.w.nodes)]
		at := 20 + (pick>>10)%100
		in.kill(n, "to start it with a failing write-ahead file")
		in.sleep(ctx, down)
		return in.walFail(ctx, n, at)
	case StepFailpoint:
		n := in.w.nodes[pick%len(in.w.nodes)]
		point := clusterPoints[(pick/len(in.w.nodes))%len(clusterPoints)]
		at := 1 + (pick>>10)%40
		in.kill(n, "to start it armed at a failpoint")
		in.sleep(ctx, down)
		return in.failpointKill(ctx, n, point, at)
	default:
		return fmt.Errorf("unknown cluster fault step %q", step)
	}
	return nil
}

// partition names the pick-th partition of the produced topics.
func (in *clusterInjector) partition(pick int) (string, int) {
	var ps [][2]any
	for _, t := range in.w.cfg.Topics() {
		for p := 0; p < t.Partitions; p++ {
			ps = append(ps, [2]any{t.Name, p})
		}
	}
	x := ps[pick%len(ps)]
	return x[0].(string), x[1].(int)
}

func (in *clusterInjector) kill(n *node.Node, role string) {
	in.mu.Lock()
	in.taken[n.ID()] = true
	in.mu.Unlock()
	t0 := in.now()
	_ = n.Kill() // a node that exited already is as good as killed
	in.fault(history.FaultKill, t0, in.now(), n.ID(), role)
}

func (in *clusterInjector) killRestart(ctx context.Context, id, role string, down time.Duration) error {
	n := in.byID[id]
	in.kill(n, role)
	in.sleep(ctx, down)
	return in.restart(ctx, n)
}

// nodeClock is a node's wall clock against the run's: off at since (the run's clock),
// gaining drift seconds a second from then on, across restarts.
type nodeClock struct {
	off   time.Duration
	drift float64
	since int64
}

// at is the clock's offset at t.
func (c nodeClock) at(t int64) time.Duration {
	return c.off + time.Duration(c.drift*float64(t-c.since))
}

// rolling restarts every node in the step's order as an operator would: SIGTERM (the
// node hands over what it leads), start it again, and wait until it is ready and the
// cluster healthy before the next.
func (in *clusterInjector) rolling(ctx context.Context) error {
	for _, k := range in.perm {
		n := in.w.nodes[k]
		in.mu.Lock()
		in.taken[n.ID()] = true
		in.mu.Unlock()
		t0 := in.now()
		err := n.Stop(30 * time.Second)
		in.fault(history.FaultStop, t0, in.now(), n.ID(), "rolling restart: SIGTERM")
		if err != nil {
			in.note("rolling restart: stopping %s: %v", n.ID(), err)
		}
		if err := in.restart(ctx, n); err != nil {
			return err
		}
		in.mu.Lock()
		delete(in.taken, n.ID())
		in.mu.Unlock()
		if !in.healthy(ctx, 60*time.Second) {
			in.note("rolling restart: the cluster was not healthy within 60 s after %s came back; going on", n.ID())
		}
	}
	return nil
}

// clusterPoints are the failpoints a failpoint-kill step arms: where a replica's
// applying of committed entries may be cut short (the partition group's Raft log is
// synced before any of them, so the replica applies again what they cut).
var clusterPoints = []string{"partition-after-append", "partition-after-settle", "segment-after-write"}

// failpointKill starts the stopped node n armed to kill itself at the at-th pass of
// point, waits until it did (20 s at most, then kills it), records the kill where the
// node said it acted, and starts it again unarmed.
func (in *clusterInjector) failpointKill(ctx context.Context, n *node.Node, point string, at int) error {
	t0 := in.now()
	if err := in.start(n, fmt.Sprintf("NARAD_FAILPOINTS=%s:kill@%d", point, at)); err != nil {
		return err
	}
	select {
	case <-n.Exited():
	case <-time.After(20 * time.Second):
		in.kill(n, fmt.Sprintf("armed %s:kill@%d was not reached", point, at))
	case <-ctx.Done():
		in.kill(n, "")
	}
	end := in.now()
	in.fault(history.FaultRestart, t0, end, n.ID(), "armed "+point)
	for _, f := range n.TakeFired() {
		if f.Action == "kill" {
			in.fault(history.FaultFailpointKill, firedAt(in.w.clk, f, end), end, n.ID(), f.Name)
		}
	}
	return in.restart(ctx, n)
}

// walFail starts the stopped node n with the at-th round of its write-ahead file
// failing its sync (EIO), waits for it to stop itself, which it must do with exit
// status 74, and restarts it. A node that never reached the round in 30 s is killed.
func (in *clusterInjector) walFail(ctx context.Context, n *node.Node, at int) error {
	t0 := in.now()
	if err := in.start(n, fmt.Sprintf("NARAD_FAILPOINTS=wal-after-write:eio@%d", at)); err != nil {
		return err
	}
	select {
	case <-n.Exited():
	case <-time.After(30 * time.Second):
		in.kill(n, fmt.Sprintf("its write-ahead round %d was not reached in 30 s", at))
	case <-ctx.Done():
		in.kill(n, "")
	}
	end := in.now()
	in.fault(history.FaultRestart, t0, end, n.ID(), "armed wal-after-write:eio")
	fired := n.TakeFired()
	for _, f := range fired {
		in.fault(history.FaultDisk, firedAt(in.w.clk, f, end), end, n.ID(), f.Name+": "+f.Action)
	}
	if len(fired) > 0 && !strings.Contains(n.ExitState(), "exit status 74") {
		return fmt.Errorf("%s's write-ahead file failed and it ended with %q, not exit status 74 (fail-stop)", n.ID(), n.ExitState())
	}
	if len(fired) == 0 {
		in.note("walfail: %s's write-ahead round %d was not reached", n.ID(), at)
	}
	return in.restart(ctx, n)
}

// diskFault starts the stopped node n with its at-th segment write failing as action
// says (eio, enospc, or a 1.5 s sleep), lets it run 10 s, then kills and restarts it
// (a replica whose write failed hands its leadership over and is rebuilt from its
// group meanwhile).
// The disk fault's line runs from where the node said it acted to the restart.
func (in *clusterInjector) diskFault(ctx context.Context, n *node.Node, action string, at int) error {
	t0 := in.now()
	point := diskPoint(action)
	if err := in.start(n, fmt.Sprintf("NARAD_FAILPOINTS=%s:%s@%d", point, action, at)); err != nil {
		return err
	}
	if err := n.WaitReady(120 * time.Second); err != nil && n.Running() {
		return fmt.Errorf("starting %s with a failing disk: %w", n.ID(), err)
	}
	in.fault(history.FaultRestart, t0, in.now(), n.ID(), "armed "+point+":"+action)
	in.sleep(ctx, 10*time.Second)
	in.kill(n, "after its disk fault")
	fired := n.TakeFired()
	end := in.now()
	if err := in.restart(ctx, n); err != nil {
		return err
	}
	for _, f := range fired {
		in.fault(history.FaultDisk, firedAt(in.w.clk, f, end), in.now(), n.ID(), f.Name+": "+f.Action)
	}
	if len(fired) == 0 {
		in.note("disk: %s's write %d was not reached in 10 s", n.ID(), at)
	}
	return nil
}

// clockRecordStep is how far a node's offset against the run's clock must differ from
// its last clock line for a start to write another: the checker allows a delay child's
// copy, stamped on one node after another decided it, only 2 ms beyond the offsets.
const clockRecordStep = time.Millisecond

// start starts a stopped node with its clock offset, if a step gave it one. A drifting
// clock starts where it had drifted to, and its line is written now (the offset is
// the drift's so far), before the node starts.
//
// The node reads the machine's wall clock as it starts and counts on from it with the
// monotonic clock, so it runs off the run's clock also by however far the machine's
// wall clock has moved against the monotonic one since the run began (a virtual
// machine's host, NTP): the line says so whenever that changed the node's offset.
// Without it, nodes started before and after such a move (a rolling restart) stamped
// up to 25 ms apart, and the checker took the delay child's copies stamped that much
// early for violations (a netns chaos run, seed 2974028834, the machine's clock 0.5 s
// ahead of its monotonic one after two minutes).
func (in *clusterInjector) start(n *node.Node, env ...string) error {
	return n.Start(append(env, in.clockEnv(n.ID())...)...)
}

// clockEnv returns the environment that gives node id its clock at a start now, and
// writes its clock line first when start says one is due.
func (in *clusterInjector) clockEnv(id string) []string {
	t := in.now()
	machine := in.wallDrift()
	in.mu.Lock()
	c := in.clock[id]
	off := c.at(t)
	total := off + machine
	last := in.recorded[id]
	write := c.drift != 0 || total-last >= clockRecordStep || last-total >= clockRecordStep
	if write {
		in.recorded[id] = total
	}
	in.mu.Unlock()
	if write {
		detail := fmt.Sprintf("%s's wall clock %s against the others'", id, fmtStep(off))
		if c.drift != 0 {
			detail += fmt.Sprintf(", gaining %+.0f ms a second", 1000*c.drift)
		}
		if machine != 0 {
			detail += fmt.Sprintf("; the machine's wall clock %s against the monotonic clock since the run began (%s in all)", fmtStep(machine), fmtStep(total))
		}
		in.w.rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultClock, Call: t, Return: t, Target: id,
			Detail: detail, ClockOffset: int64(total), ClockDrift: c.drift, Partition: -1, Offset: -1})
	}
	switch {
	case c.drift != 0:
		return []string{ClockEnvVar + "=" + off.String(), ClockDriftEnvVar + "=" + strconv.FormatFloat(c.drift, 'f', -1, 64)}
	case c.off != 0:
		return []string{ClockEnvVar + "=" + c.off.String()}
	}
	return nil
}

// restart starts a stopped node and waits until it is ready.
func (in *clusterInjector) restart(ctx context.Context, n *node.Node) error {
	t0 := in.now()
	if err := in.start(n); err != nil {
		return err
	}
	if err := n.WaitReady(120 * time.Second); err != nil {
		return fmt.Errorf("restarting %s: %w", n.ID(), err)
	}
	in.fault(history.FaultRestart, t0, in.now(), n.ID(), "")
	in.mu.Lock()
	delete(in.taken, n.ID())
	in.mu.Unlock()
	return ctx.Err()
}

// killAll kills every node within a few milliseconds (one goroutine each, released at
// once), then starts them in an order drawn from the seed, jitter apart.
func (in *clusterInjector) killAll(ctx context.Context, jitter time.Duration) error {
	order := in.restartOrder(len(in.w.nodes))
	in.mu.Lock()
	for _, n := range in.w.nodes {
		in.taken[n.ID()] = true
	}
	in.mu.Unlock()
	var wg sync.WaitGroup
	gate := make(chan struct{})
	sent := make([]int64, len(in.w.nodes))
	for i, n := range in.w.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			sent[i] = in.now()
			_ = n.Kill() // a node that exited already is as good as killed
			in.fault(history.FaultKill, sent[i], in.now(), n.ID(), "kill-all")
		}()
	}
	close(gate)
	wg.Wait()
	if spread := time.Duration(slices.Max(sent) - slices.Min(sent)); spread > 10*time.Millisecond {
		in.note("kill-all: the kill signals spread over %v (more than 10 ms: a loaded machine)", spread)
	}
	return in.restartAll(ctx, in.w.nodes, order, jitter, "kill-all")
}

// restartAll starts the stopped nodes in the given order, jitter apart, and waits until
// each is ready (a node waits for a majority, so they are waited for together).
func (in *clusterInjector) restartAll(ctx context.Context, nodes []*node.Node, order []int, jitter time.Duration, why string) error {
	var wg sync.WaitGroup
	starts := make([]int64, len(order))
	for i, k := range order {
		starts[i] = in.now()
		if err := in.start(nodes[k]); err != nil {
			return err
		}
		if i < len(order)-1 {
			in.sleep(ctx, jitter)
		}
	}
	errs := make([]error, len(order))
	for i, k := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = nodes[k].WaitReady(120 * time.Second)
		}()
	}
	wg.Wait()
	for i, k := range order {
		n := nodes[k]
		if errs[i] != nil {
			return fmt.Errorf("restarting %s after %s: %w", n.ID(), why, errs[i])
		}
		in.fault(history.FaultRestart, starts[i], in.now(), n.ID(), fmt.Sprintf("%s, started %d of %d", why, i+1, len(order)))
		in.mu.Lock()
		delete(in.taken, n.ID())
		in.mu.Unlock()
	}
	return ctx.Err()
}

func (in *clusterInjector) pause(id, role string) {
	n := in.byID[id]
	in.mu.Lock()
	in.taken[id] = true
	in.mu.Unlock()
	t0 := in.now()
	if err := n.Pause(); err != nil {
		in.note("pause of %s: %v", id, err)
		return
	}
	in.sleep(context.Background(), in.cfg.PauseFor) // always resumed, even when cancelled
	_ = n.Resume()                                  // one that cannot be resumed is killed by the final stop
	in.fault(history.FaultPause, t0, in.now(), id, fmt.Sprintf("%s, %v", role, in.cfg.PauseFor))
	in.mu.Lock()
	delete(in.taken, id)
	in.mu.Unlock()
}

// Chaosnet rules (see broker/internal/transport/chaosnet.go): one per line,
// "drop in|out PROB", "delay in|out D JITTER", "dup in|out PROB", each for every peer or,
// with a peer's cluster address ADDR at the end, for that peer only.
var netRules = map[string]string{
	StepNetCut:   "drop in 1\ndrop out 1\n",
	StepNetDeaf:  "drop in 1\n",
	StepNetMute:  "drop out 1\n",
	StepNetLossy: "drop in 0.05\ndrop out 0.05\n",
	StepNetSlow:  "delay out 100ms 80ms\ndup out 0.05\n",
}

// netSide is what one node's network does during a fault: its chaosnet rules, and its
// namespace's iptables drops (kernel: whether the step has a kernel form; netslow has
// none here, no netem).
type netSide struct {
	rules  string
	ns     netns.Fault
	kernel bool
}

// split is the minority side of a netsplit of n nodes holding leader: the leader and
// the first others of the step's permutation, fewer than half of the nodes in all.
func (in *clusterInjector) split(leader string) (minority, majority []string) {
	minority = []string{leader}
	for _, k := range in.perm {
		id := in.w.nodes[k].ID()
		if id == leader {
			continue
		}
		if len(minority) < (len(in.w.nodes)-1)/2 {
			minority = append(minority, id)
		} else {
			majority = append(majority, id)
		}
	}
	return minority, majority
}

// netFaults are the sides of step on node id ("" for every node). Chaosnet makes a
// fault in the node's own socket; in namespaces the kernel drops what a node receives
// (a mute node is one whose packets its peers drop), so no node's send fails as under a
// local firewall.
func (in *clusterInjector) netFaults(step, id string) map[string]netSide {
	out := map[string]netSide{}
	ip := func(x string) string {
		if in.cfg.Netns == nil {
			return ""
		}
		h, _ := in.cfg.Netns.Host(x)
		return h.IP
	}
	side := func(x string) netSide { s := out[x]; s.kernel = step != StepNetSlow; return s }
	deafTo := func(x, peer string, p float64) {
		s := side(x)
		s.ns = append(s.ns, netns.Drop{Peer: ip(peer), P: p})
		out[x] = s
	}
	switch step {
	case StepNetSplit:
		minority, majority := in.split(id)
		for _, pair := range [][2][]string{{minority, majority}, {majority, minority}} {
			for _, x := range pair[0] {
				var rules strings.Builder
				for _, y := range pair[1] {
					fmt.Fprintf(&rules, "drop in 1 %s\ndrop out 1 %s\n", in.cfg.PlaneAddrs[y], in.cfg.PlaneAddrs[y])
					deafTo(x, y, 1)
				}
				s := out[x]
				s.rules = rules.String()
				out[x] = s
			}
		}
		return out
	case StepNetLossy, StepNetSlow:
		for _, n := range in.w.nodes {
			x := n.ID()
			if step == StepNetLossy {
				deafTo(x, "", 0.05)
			}
			s := side(x)
			s.rules = netRules[step]
			out[x] = s
		}
		return out
	}
	// A leader's cut (both ways), deafness or muteness.
	s := side(id)
	s.rules = netRules[step]
	out[id] = s
	if step == StepNetCut || step == StepNetDeaf {
		deafTo(id, "", 1)
	}
	if step == StepNetCut || step == StepNetMute {
		for _, n := range in.w.nodes {
			if x := n.ID(); x != id {
				deafTo(x, id, 1)
			}
		}
	}
	return out
}

// net applies a network fault for NetFor: to node id, or to every node (""); a netsplit
// cuts id's side from the rest. In a run on network namespaces (Netns) the kernel
// drops the packets (iptables in each node's namespace); otherwise, and for the steps
// the kernel cannot make here, the node's chaosnet rules do. When the node leads
// topic/p, the fault's line says whether another node led it before the fault was
// lifted (a cut leader must be replaced).
func (in *clusterInjector) net(ctx context.Context, step, id, role, topic string, p int) {
	sides := in.netFaults(step, id)
	kernel := in.cfg.Netns != nil
	ids := make([]string, 0, len(sides))
	for x, side := range sides {
		if kernel && side.kernel || side.rules != "" {
			ids = append(ids, x)
		}
	}
	sort.Strings(ids)
	// The nodes the fault is of (the others only drop what a mute or cut node sends):
	// their stats samples are not held to the marker rules while it lasts.
	target := ids
	if id != "" && step != StepNetSplit {
		target = []string{id}
	}
	for _, x := range ids {
		if kernel && sides[x].kernel {
			continue
		}
		if in.cfg.ChaosNet[x] == "" || !in.byID[x].ChaosNet() {
			in.note("%s: node %s runs without a chaosnet rules file (a build without -tags chaosnet?); skipped", step, x)
			return
		}
	}
	apply := func(x string, heal bool) error {
		side := sides[x]
		if kernel && side.kernel {
			h, _ := in.cfg.Netns.Host(x)
			f := side.ns
			if heal {
				f = nil
			}
			return in.cfg.Netns.Apply(context.Background(), h, f)
		}
		if heal {
			return writeRules(in.cfg.ChaosNet[x], "")
		}
		return writeRules(in.cfg.ChaosNet[x], side.rules)
	}
	t0 := in.now()
	for _, x := range target {
		in.mu.Lock()
		in.taken[x] = true
		in.mu.Unlock()
	}
	for _, x := range ids {
		if err := apply(x, false); err != nil {
			in.note("%s on %s: %v", step, x, err)
		}
	}
	start := time.Now()
	outcome := ""
	if topic != "" {
		// Another leader must take over while the fault lasts (within NetFor).
		if next := in.leaderWithin(ctx, topic, p, id, in.cfg.NetFor); next != "" {
			outcome = fmt.Sprintf("; %s led %s/%d after %v", next, topic, p, time.Since(start).Round(10*time.Millisecond))
			in.w.mu.Lock()
			in.w.stats.NetLeaderMoved++
			in.w.mu.Unlock()
		} else {
			outcome = fmt.Sprintf("; no other node led %s/%d while it lasted", topic, p)
		}
	}
	in.sleep(context.Background(), in.cfg.NetFor-time.Since(start)) // always healed, even when cancelled
	for _, x := range ids {
		if err := apply(x, true); err != nil {
			in.note("healing %s: %v", x, err)
		}
	}
	for _, x := range target {
		in.mu.Lock()
		delete(in.taken, x)
		in.mu.Unlock()
	}
	how := strings.ReplaceAll(strings.TrimSpace(netRules[step]), "\n", "; ")
	if step == StepNetSplit {
		minority, majority := in.split(id)
		how = fmt.Sprintf("%s cut from %s", strings.Join(minority, ","), strings.Join(majority, ","))
	}
	if kernel && sides[ids[0]].kernel {
		how += ", made by iptables in the nodes' namespaces"
	}
	in.fault(history.FaultNet, t0, in.now()+int64(chaosNetPoll), strings.Join(target, ","), fmt.Sprintf("%s: %s for %v (%s)%s", step, role, in.cfg.NetFor, how, outcome))
}

// leaderWithin polls (through nodes other than not) until a node other than not leads
// topic/p, for at most d; it returns that node's id or "".
func (in *clusterInjector) leaderWithin(ctx context.Context, topic string, p int, not string, d time.Duration) string {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		// Every node at once, each bounded: a node asked for a topic's counters waits
		// on a cut leader for the partitions it leads.
		found := make(chan string, len(in.w.nodes))
		var wg sync.WaitGroup
		for _, n := range in.w.nodes {
			if n.ID() == not || !n.Running() {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// 3 s: a loaded node answers a topic's counters slowly while a holder is
				// cut off (it waits up to the liveness timeout for it).
				rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				if st, ok := ReadTopic(rctx, n.URL(), topic); ok && p < len(st) && st[p].Leader != "" && st[p].Leader != not && !st[p].unavailable() {
					found <- st[p].Leader
				}
			}()
		}
		wg.Wait()
		close(found)
		if l, ok := <-found; ok {
			return l
		}
		in.sleep(ctx, 50*time.Millisecond)
	}
	return ""
}

// slowDiskFor is how long a slowdisk step's disk stays slow, and slowDiskSync how long
// each of its write-ahead syncs takes meanwhile.
const (
	slowDiskFor  = 15 * time.Second
	slowDiskSync = 1500 * time.Millisecond
)

// slowDisk makes every write-ahead sync of node id, which leads topic/p, take
// slowDiskSync for slowDiskFor, through its failpoints file (the node runs on: it is
// not restarted), then makes its disk quick again. The node must hand the partitions
// it leads over to healthy replicas meanwhile (its fault line says whether another
// node led topic/p before the disk was quick again); the checker holds the contract
// through it all.
func (in *clusterInjector) slowDisk(ctx context.Context, id, role, topic string, p int) {
	n := in.byID[id]
	path := in.cfg.Failpoints[id]
	if path == "" || !n.FailpointsFile() {
		in.note("%s: node %s runs without a failpoints file (a build without -tags failpoints?); skipped", StepSlowDisk, id)
		return
	}
	in.mu.Lock()
	in.taken[id] = true
	in.mu.Unlock()
	defer func() {
		in.mu.Lock()
		delete(in.taken, id)
		in.mu.Unlock()
	}()
	t0 := in.now()
	if err := writeRules(path, fmt.Sprintf("wal-sync:sleep(%s)", slowDiskSync)); err != nil {
		in.note("%s on %s: %v", StepSlowDisk, id, err)
		return
	}
	start := time.Now()
	outcome := "still led by the slow node when its disk was quick again"
	if next := in.leaderWithin(ctx, topic, p, id, slowDiskFor); next != "" {
		outcome = fmt.Sprintf("%s led it %v after the disk turned slow", next, time.Since(start).Round(100*time.Millisecond))
	}
	in.sleep(ctx, slowDiskFor-time.Since(start))
	err := writeRules(path, "")
	// A sync that began before the file was read again runs on for up to its length.
	end := in.now() + int64(failpointPoll+slowDiskSync)
	n.TakeFired() // the step's own fault line covers every slow sync
	in.fault(history.FaultDisk, t0, end, id, fmt.Sprintf("slow disk (every write-ahead sync %v) for %v, %s: %s", slowDiskSync, slowDiskFor, role, outcome))
	if err != nil {
		in.note("%s on %s: making the disk quick again: %v", StepSlowDisk, id, err)
	}
}

// failpointPoll is how often a failpoints build reads its failpoints file (it mirrors
// broker/internal/failpoint.FilePoll).
const failpointPoll = 100 * time.Millisecond

// chaosNetPoll is how often a chaosnet node reads its rules file: a fault's window
// reaches that far past the moment the file was rewritten.
const chaosNetPoll = 100 * time.Millisecond

// writeRules replaces a rules file at once (write and rename), so a node never reads
// half of it.
func writeRules(path, rules string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(rules), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// crashes records every node that exited without being killed: a broker crash.
func (in *clusterInjector) crashes() {
	for _, n := range in.w.nodes {
		in.mu.Lock()
		taken := in.taken[n.ID()]
		in.mu.Unlock()
		if taken || n.Running() || n.Exited() == nil {
			continue
		}
		t := in.now()
		in.fault(history.FaultCrash, t, t, n.ID(), "exited by itself: "+n.ExitState())
		in.note("node %s exited by itself (%s); see its log", n.ID(), n.ExitState())
		in.mu.Lock()
		in.taken[n.ID()] = true // reported once; ensureUp starts it again
		in.mu.Unlock()
	}
}

// ensureUp leaves every node running, resumed and with its network healed.
func (in *clusterInjector) ensureUp(ctx context.Context, _ bool) error {
	if in.byID == nil {
		in.init()
	}
	in.crashes()
	for _, n := range in.w.nodes {
		if n.Paused() {
			_ = n.Resume() // a node that cannot be resumed is killed by the final stop
		}
		if p := in.cfg.ChaosNet[n.ID()]; p != "" {
			_ = writeRules(p, "") // healed; a missing directory shows in the next start
		}
		if p := in.cfg.Failpoints[n.ID()]; p != "" {
			_ = writeRules(p, "") // a quick disk again
		}
		if in.cfg.Netns != nil {
			if h, ok := in.cfg.Netns.Host(n.ID()); ok {
				if err := in.cfg.Netns.Apply(ctx, h, nil); err != nil {
					in.note("healing %s's namespace: %v", n.ID(), err)
				}
			}
		}
		if !n.Running() {
			if err := in.restart(ctx, n); err != nil {
				return err
			}
		}
	}
	if !in.healthy(ctx, 90*time.Second) {
		in.note("the cluster was not healthy within 90 s after the fault phase")
	}
	return ctx.Err()
}

func (in *clusterInjector) recordSkips() {
	t := in.now()
	for _, n := range in.w.nodes {
		for _, s := range n.TakeSkips() {
			in.w.rec.Add(history.Entry{Kind: history.KindFault, Fault: history.FaultSkipped, Call: t, Return: t, Target: s.Log,
				Topic: s.Topic, Partition: s.Partition, Offset: s.Offset, Detail: s.Child, Node: n.ID()})
		}
	}
}

// topicState reads a topic through the first running node that answers.
func (in *clusterInjector) topicState(ctx context.Context, topic string) ([]PartitionStats, bool) {
	for _, n := range in.w.nodes {
		if !n.Running() || n.Paused() {
			continue
		}
		st, ok := ReadTopic(ctx, n.URL(), topic)
		if ok {
			return st, true
		}
	}
	return nil, false
}

// leaderOf waits (up to 20 s) until a running node names a running leader of topic/p
// other than not, and returns its id ("" if none).
func (in *clusterInjector) leaderOf(ctx context.Context, topic string, p int, not string) string {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if st, ok := in.topicState(ctx, topic); ok && p < len(st) {
			if id := st[p].Leader; id != "" && id != not && in.byID[id] != nil && in.byID[id].Running() && !st[p].unavailable() {
				return id
			}
		}
		in.sleep(ctx, 20*time.Millisecond)
	}
	return ""
}

// controller returns the control plane's leader as the running nodes name it.
func (in *clusterInjector) controller(ctx context.Context) string {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, n := range in.w.nodes {
			if !n.Running() || n.Paused() {
				continue
			}
			if id := Controller(ctx, n.URL()); id != "" && in.byID[id] != nil && in.byID[id].Running() {
				return id
			}
		}
		in.sleep(ctx, 50*time.Millisecond)
	}
	return ""
}

// healthy waits until every node is ready and, read through each, every partition of
// every topic has a leader and its followers are caught up to within a few messages.
func (in *clusterInjector) healthy(ctx context.Context, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if err := ClusterSettled(ctx, in.w.nodes, in.w.cfg.Topics(), 200); err == nil {
			return true
		}
		in.sleep(ctx, 200*time.Millisecond)
	}
	return false
}

var probe = &http.Client{Timeout: 3 * time.Second}

// settleFor is how long every partition's leader and epoch must stay the same before a
// cluster run's load starts: the first elections of a new topic's groups may take
// turns, and a load that starts under them sees failovers no fault made.
const settleFor = 3 * time.Second

// settle waits (up to a minute) until the cluster is healthy and no partition changed
// leader or epoch for settleFor.
func (w *run) settle(ctx context.Context) {
	deadline := time.Now().Add(time.Minute)
	prev, since := "", time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		fp := ""
		if ClusterSettled(ctx, w.nodes, w.cfg.Topics(), 0) == nil {
			for _, t := range w.cfg.Topics() {
				st, _ := ReadTopic(ctx, w.nodes[0].URL(), t.Name)
				for _, s := range st {
					fp += fmt.Sprintf("%s/%d %s %d;", t.Name, s.Partition, s.Leader, s.Epoch)
				}
			}
		}
		if fp == "" || fp != prev {
			prev, since = fp, time.Now()
		} else if time.Since(since) >= settleFor {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	w.note("the cluster's leaders did not stay put for %v within a minute of creating the topics", settleFor)
}

// ReadTopic reads GET /v1/topics/{topic} through base (no history line).
func ReadTopic(ctx context.Context, base, topic string) ([]PartitionStats, bool) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/topics/"+topic, nil)
	resp, err := probe.Do(req)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	var t struct {
		Stats []PartitionStats `json:"partition_stats"`
	}
	if json.NewDecoder(resp.Body).Decode(&t) != nil {
		return nil, false
	}
	return t.Stats, true
}

// Controller returns the controller GET /v1/cluster through base names ("" if none).
func Controller(ctx context.Context, base string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/cluster", nil)
	resp, err := probe.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var c struct {
		Controller string `json:"controller"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&c) != nil {
		return ""
	}
	return c.Controller
}

// MembersAlive returns nil when every node, asked through its own API, lists every
// node of ids as a member with status alive; otherwise what is not so. A fresh cluster's
// nodes are ready before the controller has heard every member's first heartbeat, and
// a topic with a replica per node is refused until it has.
func MembersAlive(ctx context.Context, nodes []*node.Node) error {
	for _, n := range nodes {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.URL()+"/v1/cluster", nil)
		resp, err := probe.Do(req)
		if err != nil {
			return fmt.Errorf("%s: %w", n.ID(), err)
		}
		var c struct {
			Members []struct {
				ID     string `json:"id"`
				Status string `json:"status"`
			} `json:"members"`
		}
		err = json.NewDecoder(resp.Body).Decode(&c)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: GET /v1/cluster answered %d", n.ID(), resp.StatusCode)
		}
		alive := map[string]bool{}
		for _, m := range c.Members {
			alive[m.ID] = m.Status == "alive"
		}
		for _, o := range nodes {
			if !alive[o.ID()] {
				return fmt.Errorf("%s does not list %s as alive", n.ID(), o.ID())
			}
		}
	}
	return nil
}

// ClusterSettled returns nil when every node is running and ready and, read through
// each, every partition of topics is available, has a leader and replication-1
// followers each at most maxLag messages behind; otherwise what is not so.
func ClusterSettled(ctx context.Context, nodes []*node.Node, topics []history.TopicInfo, maxLag int64) error {
	for _, n := range nodes {
		if !n.Running() || n.Paused() {
			return fmt.Errorf("%s is down", n.ID())
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.URL()+"/readyz", nil)
		resp, err := probe.Do(req)
		if err != nil {
			return fmt.Errorf("%s: %w", n.ID(), err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s is not ready (%d)", n.ID(), resp.StatusCode)
		}
		for _, t := range topics {
			st, ok := ReadTopic(ctx, n.URL(), t.Name)
			if !ok || len(st) != t.Partitions {
				return fmt.Errorf("%s does not show %s", n.ID(), t.Name)
			}
			for _, s := range st {
				if s.unavailable() || s.Leader == "" || len(s.Followers) != t.Replication-1 {
					return fmt.Errorf("%s/%d through %s: leader %q, %d followers", t.Name, s.Partition, n.ID(), s.Leader, len(s.Followers))
				}
				for _, f := range s.Followers {
					if f.Lag > maxLag {
						return fmt.Errorf("%s/%d: follower %s lags %d", t.Name, s.Partition, f.Node, f.Lag)
					}
				}
			}
		}
	}
	return nil
}

// ErrNotSettled: the cluster did not settle within the bound.
var ErrNotSettled = errors.New("the cluster did not settle")

// DataDirPartitions lists a data directory's partition log directories:
// topic → partition → path of its log/ directory (the newest incarnation's).
func DataDirPartitions(dataDir string) map[string]map[int32]string {
	out, _ := DataDirIncarnations(dataDir)
	return out
}

// DataDirIncarnations is DataDirPartitions with the incarnation of each topic's
// directories.
func DataDirIncarnations(dataDir string) (map[string]map[int32]string, map[string]int64) {
	out := map[string]map[int32]string{}
	incs := map[string]int64{}
	_ = filepath.WalkDir(filepath.Join(dataDir, "topics"), func(p string, d os.DirEntry, err error) error { // always nil: the callback skips what it cannot read
		if err != nil || !d.IsDir() || d.Name() != "log" {
			return nil
		}
		topic, inc, part, ok := partitionOf(p)
		if !ok || inc < incs[topic] {
			return nil
		}
		if inc > incs[topic] {
			incs[topic], out[topic] = inc, map[int32]string{}
		}
		out[topic][part] = p
		return nil
	})
	return out, incs
}

// damageReplica damages one file of a stopped cluster node's replicas, as a disk
// would: a bit flipped in a record of a partition's message log or settle journal that
// has a valid record after it (so it was acknowledged: the node must treat it as
// damage, not as a torn write), or bytes that are no whole record appended to the
// newest segment of a message log, settle journal or the group's Raft log (a torn
// write). It returns the damaged file, relative to dataDir, and what was done; "" when
// the node holds nothing to damage.
func damageReplica(rng *rand.Rand, dataDir string) (rel, detail string) {
	var logs, rafts []string
	_ = filepath.WalkDir(filepath.Join(dataDir, "topics"), func(p string, d os.DirEntry, err error) error { // always nil: the callback skips what it cannot read
		if err != nil || !d.IsDir() {
			return nil
		}
		if d.Name() == "damaged" {
			return filepath.SkipDir // set aside by an earlier rebuild; never read again
		}
		switch {
		case d.Name() == "log" || d.Name() == "journal":
			logs = append(logs, p)
		case d.Name() == "raft" || strings.HasPrefix(d.Name(), "raft-f"):
			rafts = append(rafts, p)
		}
		return nil
	})
	sort.Strings(logs)
	sort.Strings(rafts)
	if len(logs) == 0 {
		return "", ""
	}
	if rng.Intn(2) == 0 {
		// A bit flip in a record of the active segment, never its last.
		dir := logs[rng.Intn(len(logs))]
		if path := activeSegment(dir); path != "" {
			if b, err := os.ReadFile(path); err == nil {
				if fs := Frames(b); len(fs) >= 2 {
					f := fs[rng.Intn(len(fs)-1)]
					at := f.Pos + 8 + rng.Intn(f.Size-8) // inside what the CRC covers
					bit := byte(1) << rng.Intn(8)
					if writeAt(path, []byte{b[at] ^ bit}, int64(at)) == nil {
						rel, _ = filepath.Rel(dataDir, path)
						return rel, fmt.Sprintf("bit flip in record %d (byte %d of the file)", f.Offset, at)
					}
				}
			}
		}
	}
	// A torn tail, on a Raft log half the time when there is one.
	var path string
	if len(rafts) > 0 && rng.Intn(2) == 0 {
		path = newestFile(rafts[rng.Intn(len(rafts))], ".raft")
	} else {
		path = activeSegment(logs[rng.Intn(len(logs))])
	}
	if path == "" {
		return "", ""
	}
	kind, tail := tornBytes(rng)
	fi, err := os.Stat(path)
	if err != nil || writeAt(path, tail, fi.Size()) != nil {
		return "", ""
	}
	rel, _ = filepath.Rel(dataDir, path)
	return rel, fmt.Sprintf("torn tail: %d bytes of %s", len(tail), kind)
}

// newestFile returns the path of the last file of dir whose name ends in suffix.
func newestFile(dir, suffix string) string {
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), suffix) {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	return filepath.Join(dir, names[len(names)-1])
}

// writeAt writes b at off of the file at path (unsynced: the node is stopped, and the
// page cache is what it reads when it starts again).
func writeAt(path string, b []byte, off int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(b, off)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// moveParties are whom a move step kills while the move is under way ("": nobody; the
// leader twice, so five moves in six kill someone), as the move-kill matrix of make
// chaos-cluster does, but under the checker.
var moveParties = []string{"", "controller", "leader", "source", "target", "leader"}

// move moves the replica of the pick-th partition (of a topic that is not recreated)
// held by one of its nodes to a node that holds none, under load, through POST
// /v1/cluster/moves; the party the pick draws is killed -9 while the move copies or
// switches, and restarted after down. It waits until the move ended (3 minutes at
// most): a move left under way at the end of a run would leave one replica too many.
func (in *clusterInjector) move(ctx context.Context, pick int, down time.Duration) error {
	var ps [][2]any
	for _, t := range in.w.cfg.Topics() {
		for p := 0; p < t.Partitions && !t.Recreated; p++ {
			ps = append(ps, [2]any{t.Name, p})
		}
	}
	x := ps[pick%len(ps)]
	topic, p := x[0].(string), x[1].(int)
	st, ok := in.topicState(ctx, topic)
	if !ok || p >= len(st) || len(st[p].Replicas) == 0 {
		in.note("move: %s/%d's replicas could not be read; skipped", topic, p)
		return nil
	}
	reps := slices.Sorted(slices.Values(st[p].Replicas))
	var spare []string
	for _, n := range in.w.nodes {
		if !slices.Contains(reps, n.ID()) && n.Running() {
			spare = append(spare, n.ID())
		}
	}
	if len(spare) == 0 {
		in.note("move: every running node holds %s/%d already; skipped", topic, p)
		return nil
	}
	from, to := reps[(pick>>4)%len(reps)], spare[(pick>>8)%len(spare)]
	party := moveParties[(pick>>12)%len(moveParties)]
	phase := []string{"copying", "switching"}[(pick>>16)%2]
	what := fmt.Sprintf("%s/%d from %s to %s", topic, p, from, to)
	if from == st[p].Leader {
		what += " (its leader's replica)"
	}
	t0 := in.now()
	id, err := in.startMove(ctx, topic, p, from, to)
	if err != nil {
		in.note("move of %s: %v; skipped", what, err)
		return nil
	}
	if party != "" {
		status := in.waitMove(ctx, id, 60*time.Second, func(s string) bool { return s != "copying" || phase == "copying" })
		var victim string
		switch party {
		case "controller":
			victim = in.controller(ctx)
		case "leader":
			victim = in.leaderOf(ctx, topic, p, "")
		case "source":
			victim = from
		case "target":
			victim = to
		}
		if victim != "" && in.byID[victim] != nil && in.byID[victim].Running() {
			role := fmt.Sprintf("the %s of the move of %s, while %s", party, what, status)
			what += fmt.Sprintf("; the %s (%s) killed while the move was %s", party, victim, status)
			if err := in.killRestart(ctx, victim, role, down); err != nil {
				return err
			}
		}
	}
	status := in.waitMove(ctx, id, 3*time.Minute, func(s string) bool { return s == "done" || s == "cancelled" || s == "failed" })
	in.fault(history.FaultMove, t0, in.now(), to, what+": "+status)
	if status != "done" {
		in.note("move of %s ended %s", what, status)
	}
	return ctx.Err()
}

type moveView struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Reason string `json:"reason"`
}

// startMove asks for the move until a node answers 202 (a retry of the same move
// answers the same move), 30 s at most; a 4xx is final.
func (in *clusterInjector) startMove(ctx context.Context, topic string, p int, from, to string) (string, error) {
	body := map[string]any{"topic": topic, "partition": p, "from": from, "to": to}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := in.c.admin(ctx, http.MethodPost, "/v1/cluster/moves", body)
		var m moveView
		switch {
		case r.status == http.StatusAccepted && json.Unmarshal(r.body, &m) == nil && m.ID != "":
			return m.ID, nil
		case r.status >= 400 && r.status < 500:
			return "", errors.New(r.err)
		case time.Now().After(deadline) || ctx.Err() != nil:
			return "", fmt.Errorf("no node started it within 30 s (last: %d %s)", r.status, r.err)
		}
		in.sleep(ctx, 200*time.Millisecond)
	}
}

// waitMove polls the move through any running node until its status satisfies done
// (or bound passes) and returns the last status seen ("unknown" if none).
func (in *clusterInjector) waitMove(ctx context.Context, id string, bound time.Duration, done func(string) bool) string {
	status := "unknown"
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, n := range in.w.nodes {
			if !n.Running() || n.Paused() {
				continue
			}
			if m, ok := readMove(ctx, n.URL(), id); ok {
				status = m.Status
				if m.Reason != "" {
					status += " (" + m.Reason + ")"
				}
				if done(m.Status) {
					return status
				}
				break
			}
		}
		in.sleep(ctx, 100*time.Millisecond)
	}
	return status
}

// readMove reads one move from GET /v1/cluster/moves through base.
func readMove(ctx context.Context, base, id string) (moveView, bool) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/cluster/moves", nil)
	resp, err := probe.Do(req)
	if err != nil {
		return moveView{}, false
	}
	defer resp.Body.Close()
	var l struct {
		Moves []moveView `json:"moves"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&l) != nil {
		return moveView{}, false
	}
	for _, m := range l.Moves {
		if m.ID == id {
			return m, true
		}
	}
	return moveView{}, false
}
