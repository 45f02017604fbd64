package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/failpoint"
	"github.com/narad-mq/narad/broker/internal/testutil"
)

// moveJSON is a move as GET /v1/cluster/moves lists it.
type moveJSON struct {
	ID        string  `json:"id"`
	Topic     string  `json:"topic"`
	Partition int     `json:"partition"`
	From      string  `json:"from"`
	To        string  `json:"to"`
	Status    string  `json:"status"`
	Reason    string  `json:"reason"`
	Cause     string  `json:"cause"`
	Progress  float64 `json:"progress"`
}

// startMovesCluster starts n nodes bootstrapped together, with the controller's own
// rebalancing off (moves start only when a test asks), and a topic of three partitions
// with three replicas and a 5 s visibility timeout under the upgrade tests' load
// (upgradeCluster: produce, consume, ack, each message tracked).
func startMovesCluster(t *testing.T, n int, extra ...string) *upgradeCluster {
	t.Helper()
	c := &upgradeCluster{t: t, topic: "moving", accepted: map[string]bool{}, acked: map[string]bool{}, delivered: map[string]int{},
		answers: map[string]int{}, stopping: map[string]bool{}, stop: make(chan struct{}),
		// A lease given by a node killed before its answer left lapses after the
		// visibility timeout; the final drain outwaits it.
		quiet: 7 * time.Second, crashes: true, visibility: 5 * time.Second}
	var peers []string
	for i := range n {
		nd := &clusterNode{id: fmt.Sprintf("n%d", i+1), addr: freeClusterAddr(t)}
		c.nodes = append(c.nodes, nd)
		peers = append(peers, nd.id+"@"+nd.addr)
	}
	c.peers = strings.Join(peers, ",")
	rel := release{name: "this binary", args: append([]string{"--auto-rebalance=false"}, extra...)}
	var opts []testutil.Options
	for _, nd := range c.nodes {
		opts = append(opts, c.options(nd, rel))
	}
	for i, p := range testutil.StartNarads(t, opts...) {
		c.nodes[i].Narad = p
		c.nodes[i].api = &api{Client: p.Client(), t: t}
	}
	atVersion(t, c.nodes[0], 3)
	c.nodes[0].api.createTopic(c.topic, map[string]any{"partitions": 3, "replication_factor": 3, "visibility_timeout_ms": 5000})
	for p := range 3 {
		leaderOf(t, c.nodes, c.topic, p)
	}
	return c
}

// moves lists the moves through nd (nil when it does not answer).
func moves(nd *clusterNode) []moveJSON {
	r, err := nd.api.Try(http.MethodGet, "/v1/cluster/moves", nil)
	if err != nil || r.Status != http.StatusOK {
		return nil
	}
	var l struct {
		Moves []moveJSON `json:"moves"`
	}
	if json.Unmarshal(r.Body, &l) != nil {
		return nil
	}
	return l.Moves
}

// startMove asks nd for a move and returns it (202).
func startMove(t *testing.T, nd *clusterNode, topic string, p int, from, to string) moveJSON {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"topic": topic, "partition": p, "from": from, "to": to})
	r := nd.api.Do(http.MethodPost, "/v1/cluster/moves", body, "Content-Type", "application/json")
	if r.Status != http.StatusAccepted {
		t.Fatalf("POST /v1/cluster/moves %s: %d %s", body, r.Status, r.Body)
	}
	var mv moveJSON
	if err := json.Unmarshal(r.Body, &mv); err != nil || mv.ID == "" {
		t.Fatalf("move answer %s: %v", r.Body, err)
	}
	return mv
}

// moveEnds waits until move id is done through any running node of c, failing on
// any other end.
func (c *upgradeCluster) moveEnds(id string, bound time.Duration) moveJSON {
	c.t.Helper()
	return moveDone(c.t, c.nodes, c.usable, id, bound)
}

// moveDone waits until move id is done, read through the first of nodes that usable
// allows, failing on any other end.
func moveDone(t *testing.T, nodes []*clusterNode, usable func(*clusterNode) bool, id string, bound time.Duration) moveJSON {
	t.Helper()
	var last moveJSON
	waitFor(t, bound, "move "+id+" to be done", func() bool {
		for _, nd := range nodes {
			if !usable(nd) {
				continue
			}
			for _, mv := range moves(nd) {
				if mv.ID == id {
					last = mv
					if mv.Status == "failed" || mv.Status == "cancelled" {
						t.Fatalf("move %s ended %s: %s", id, mv.Status, mv.Reason)
					}
					return mv.Status == "done"
				}
			}
			return false
		}
		return false
	})
	return last
}

// replicasOf reads partition p's replica set through nd.
func replicasOf(nd *clusterNode, topic string, p int) []string {
	r, err := nd.api.Try(http.MethodGet, topicPath(topic), nil)
	if err != nil || r.Status != http.StatusOK {
		return nil
	}
	var d topicDetail
	if json.Unmarshal(r.Body, &d) != nil || p >= len(d.PartitionStats) {
		return nil
	}
	out := slices.Clone(d.PartitionStats[p].Replicas)
	slices.Sort(out)
	return out
}

// partitionDir is partition p's directory of topic on nd ("" when it holds none).
func partitionDir(nd *clusterNode, topic string, p int) string {
	dirs, _ := filepath.Glob(filepath.Join(nd.DataDir(), "topics", "*-"+topic, strconv.Itoa(p)))
	if len(dirs) == 0 {
		return ""
	}
	return dirs[0]
}

func nodeByID(nodes []*clusterNode, id string) *clusterNode {
	for _, nd := range nodes {
		if nd.id == id {
			return nd
		}
	}
	return nil
}

// TestClusterMovesUnderLoad: on four nodes under a steady load tracked message by
// message, a replica moves off its partition's leader (the leadership and its leases
// are handed over first), a node is decommissioned (its replicas move to the others
// and it leaves the members), and the topic's replication factor goes down to 2 and
// back up to 3. The moved-off replicas' data is deleted only after each move ended;
// nothing 202'd is lost and nothing acked is delivered again.
func TestClusterMovesUnderLoad(t *testing.T) {
	t.Parallel()
	c := startMovesCluster(t, 4)
	c.quiet, c.crashes = 3*time.Second, false // nothing is killed here
	c.load()
	steady := time.Now()
	c.progress(100)

	// 1. Move partition 0's replica off its leader.
	moveStart := time.Now()
	lead := leaderOf(t, c.nodes, c.topic, 0)
	reps := replicasOf(lead, c.topic, 0)
	var to string
	for _, nd := range c.nodes {
		if !slices.Contains(reps, nd.id) {
			to = nd.id
		}
	}
	mv := startMove(t, c.nodes[1], c.topic, 0, lead.id, to)
	if again := startMove(t, c.nodes[2], c.topic, 0, lead.id, to); again.ID != mv.ID {
		t.Fatalf("an identical repeat started move %s, not %s", again.ID, mv.ID)
	}
	c.moveEnds(mv.ID, 90*time.Second)
	moveEnd := time.Now()
	before, nb := c.p99(steady, moveStart)
	during, nd := c.p99(moveStart, moveEnd)
	t.Logf("produce p99 before the move %v (%d produces), during it %v (%d produces, %v)", before, nb, during, nd, moveEnd.Sub(moveStart).Round(time.Millisecond))
	if during > 5*time.Second {
		t.Errorf("produce p99 during the move %v: a move must not stall the partition", during)
	}
	want := slices.DeleteFunc(slices.Clone(reps), func(r string) bool { return r == lead.id })
	want = append(want, to)
	slices.Sort(want)
	if got := replicasOf(c.nodes[0], c.topic, 0); !slices.Equal(got, want) {
		t.Fatalf("partition 0's replicas after the move: %v, want %v", got, want)
	}
	waitFor(t, 30*time.Second, "the moved-off replica's data to be deleted", func() bool { return partitionDir(lead, c.topic, 0) == "" })
	c.progress(20)

	// 2. Decommission a node that is not the controller.
	ctl := controllerOf(t, c.nodes...)
	var gone *clusterNode
	for _, nd := range c.nodes {
		if nd != ctl {
			gone = nd
		}
	}
	r := c.nodes[0].api.Do(http.MethodDelete, "/v1/cluster/members/"+gone.id, nil)
	if r.Status != http.StatusAccepted || !strings.Contains(string(r.Body), "decommissioning") {
		t.Fatalf("DELETE /v1/cluster/members/%s: %d %s", gone.id, r.Status, r.Body)
	}
	waitFor(t, 120*time.Second, gone.id+" to leave the members", func() bool {
		return !strings.Contains(membersOf(t, ctl), gone.id+"@")
	})
	c.mu.Lock()
	c.stopping[gone.id] = true
	c.mu.Unlock()
	for p := range 3 {
		if got := replicasOf(ctl, c.topic, p); len(got) != 3 || slices.Contains(got, gone.id) {
			t.Fatalf("partition %d's replicas after %s left: %v", p, gone.id, got)
		}
	}
	c.electionsGone += electionsOf(gone)
	gone.Stop()
	c.progress(20)

	// 3. Replication factor 3 → 2 → 3.
	for _, rf := range []int{2, 3} {
		r := ctl.api.Do(http.MethodPatch, topicPath(c.topic), []byte(fmt.Sprintf(`{"replication_factor":%d}`, rf)), "Content-Type", "application/json")
		if r.Status != http.StatusOK {
			t.Fatalf("PATCH replication_factor %d: %d %s", rf, r.Status, r.Body)
		}
		waitFor(t, 120*time.Second, fmt.Sprintf("every partition at %d replicas", rf), func() bool {
			for p := range 3 {
				if len(replicasOf(ctl, c.topic, p)) != rf {
					return false
				}
			}
			for _, mv := range moves(ctl) {
				if mv.Status == "copying" || mv.Status == "switching" || mv.Status == "removing" {
					return false
				}
			}
			return true
		})
		c.progress(20)
	}
	c.finish()
}

// TestClusterForcedTakeover: on five nodes (the control plane keeps its majority),
// two of a partition's three replicas are killed and their disks lost, so the
// partition can never elect a leader again. A forced takeover makes the survivor lead
// what it holds and reports a lower bound of the loss; then every message produced
// after it is delivered, nothing acked before it is delivered again, the replica set
// grows back to three on live nodes, and a lost replica's node that comes back with
// its old data is not let into the new group (its copy is not served; moved onto that
// node again, the partition is copied afresh and the old copy set aside).
func TestClusterForcedTakeover(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 5, "--auto-rebalance=false")
	atVersion(t, nodes[0], 3)
	nodes[0].api.createTopic("ft", map[string]any{"partitions": 1, "replication_factor": 3, "visibility_timeout_ms": 5000})
	lead := leaderOf(t, nodes, "ft", 0)
	reps := replicasOf(lead, "ft", 0)
	for i := range 100 {
		if s := produceTry(lead, "ft", fmt.Sprint("old", i)); s != http.StatusAccepted {
			t.Fatalf("produce %d: %d", i, s)
		}
	}
	// The first lease of the partition's group, left unsettled: the group a forced
	// takeover starts must not give a handle equal to it (the same offset, term and
	// sequence) to another consumer, or this stale one would settle that lease.
	stale := lead.api.mustConsume("ft", "1s")
	acked := map[string]bool{}
	for len(acked) < 40 {
		for _, m := range lead.api.consumeBatch("ft", 40-len(acked), "1s") {
			lead.api.mustAck("ft", &m)
			acked[payloadID(t, &m)] = true
		}
	}
	var survivor *clusterNode
	var lost []*clusterNode
	for _, id := range reps {
		nd := nodeByID(nodes, id)
		if nd != lead && survivor == nil {
			survivor = nd
		} else {
			lost = append(lost, nd)
		}
	}
	waitFor(t, 30*time.Second, "the survivor to hold all 100 messages", func() bool {
		d := survivor.api.topic("ft")
		return len(d.PartitionStats) == 1 && d.PartitionStats[0].HighWatermark == 100
	})
	for _, nd := range lost {
		nd.Kill()
	}
	wipe(t, lost[0].DataDir()) // its disk is gone; lost[1] keeps its data
	var asker *clusterNode
	for _, nd := range nodes {
		if !slices.Contains(reps, nd.id) {
			asker = nd
		}
	}
	waitFor(t, 30*time.Second, "the partition to have no leader", func() bool { return produceTry(asker, "ft", "probe") == http.StatusServiceUnavailable })

	r := forceLeader(t, asker, "ft", survivor)
	var res struct {
		Lost     *int64   `json:"possibly_lost_at_least"`
		Replicas []string `json:"replicas"`
	}
	if err := json.Unmarshal(r.Body, &res); err != nil || res.Lost == nil || !slices.Equal(res.Replicas, []string{survivor.id}) {
		t.Fatalf("force-leader answer %s: %v", r.Body, err)
	}
	if *res.Lost != 0 {
		t.Fatalf("possibly_lost_at_least %d: the survivor held every message", *res.Lost)
	}
	// A node that holds no replica is refused.
	if r := asker.api.Do(http.MethodPost, topicPath("ft")+"/partitions/0/force-leader", []byte(`{"node":"`+asker.id+`"}`), "Content-Type", "application/json"); r.Status != http.StatusConflict {
		t.Fatalf("force-leader on a node without a replica: %d %s", r.Status, r.Body)
	}
	for i := range 50 {
		waitFor(t, 30*time.Second, "a produce after the takeover", func() bool { return produceTry(asker, "ft", fmt.Sprint("new", i)) == http.StatusAccepted })
	}
	// The stale message is leased again by the new group (first, as the lowest
	// unsettled offset); the old handle answers 410 and the new one settles it.
	again := asker.api.mustConsume("ft", "5s")
	if again.Offset != stale.Offset {
		t.Fatalf("the new group leased offset %d first, want %d", again.Offset, stale.Offset)
	}
	if r := asker.api.ack("ft", stale.ReceiptHandle, ""); r.Status != http.StatusGone {
		t.Fatalf("an ack of a handle the replaced group gave out answered %d, want 410: %s", r.Status, r.Body)
	}
	asker.api.mustAck("ft", again)
	acked[payloadID(t, again)] = true
	// The set grows back to the replication factor on the live nodes.
	waitGrownBack(t, asker, "ft")
	if got := replicasOf(asker, "ft", 0); slices.Contains(got, lost[0].id) || slices.Contains(got, lost[1].id) {
		t.Fatalf("replicas %v include a lost node", got)
	}
	// The node that kept its old data comes back: not a replica, its copy not served.
	lost[1].RestartAfterKill()
	if err := lost[1].WaitReady(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the returning node to leave its old copy unserved", func() bool {
		return strings.Contains(lost[1].Log(), "holds data of a partition placed on another node")
	})
	// The controller marks it alive again from its heartbeats, a moment after it is
	// ready (a move to a node it still counts dead is refused with 409).
	waitFor(t, 30*time.Second, "the controller to see the returning node alive", func() bool {
		c, err := asker.cluster()
		if err != nil {
			return false
		}
		for _, m := range c.Members {
			if m.ID == lost[1].id {
				return m.Status == "alive"
			}
		}
		return false
	})
	// Moved onto that node again, its old copy is set aside (never served nor
	// restored over: it may hold what the survivor never had) and copied afresh.
	cur := replicasOf(asker, "ft", 0)
	curLead := leaderOf(t, nodes, "ft", 0)
	var from string
	for _, r := range cur {
		if r != curLead.id {
			from = r
		}
	}
	mv := startMove(t, asker, "ft", 0, from, lost[1].id)
	waitFor(t, 90*time.Second, "the move onto the returning node to end", func() bool {
		for _, m := range moves(asker) {
			if m.ID == mv.ID {
				return m.Status == "done"
			}
		}
		return false
	})
	if _, err := os.Stat(filepath.Join(partitionDir(lost[1], "ft", 0), "damaged")); err != nil {
		t.Fatalf("the returning node's old copy was not set aside: %v", err)
	}
	seen := map[string]int{}
	drain(t, asker, "ft", seen, 3*time.Second)
	for i := range 100 {
		id := fmt.Sprint("old", i)
		if acked[id] && seen[id] > 0 {
			t.Errorf("%s, acked before the takeover, delivered again", id)
		}
		if !acked[id] && seen[id] == 0 {
			t.Errorf("%s, unacked and held by the survivor, never delivered", id)
		}
	}
	for i := range 50 {
		if seen[fmt.Sprint("new", i)] == 0 {
			t.Errorf("new%d, produced after the takeover, never delivered", i)
		}
	}
}

// TestClusterForcedTakeoverKeepsTheSurvivorsLog: a leader whose two followers are
// lost (one cut off, then the other killed, its disk lost) holds the produces that
// were in flight then: in its Raft log, never committed, each answered 503 (its
// outcome unknown). A forced takeover onto it applies its whole log first, so those
// messages are delivered afterwards, like every 202'd one. (Before, the new group
// started from what the survivor had applied, and they were dropped.) So it does when
// the survivor is killed between the takeover and its reopening of the partition, and
// opens straight into the new group when it starts again (restart=clean; before, that
// dropped them). The follower that was only cut off, once back, closes its replica and
// leaves the replaced group (before, it closed the new group, which it never joined,
// and its old one ran on).
func TestClusterForcedTakeoverKeepsTheSurvivorsLog(t *testing.T) {
	t.Parallel()
	for _, restart := range []string{"none", "clean"} { // "writeFails": make e2e (TestClusterForcedTakeoverWriteFails)
		t.Run("restart="+restart, func(t *testing.T) {
			t.Parallel()
			forcedTakeoverKeepsTheSurvivorsLog(t, restart)
		})
	}
}

// forcedTakeoverKeepsTheSurvivorsLog: restart is "none" (the survivor's placement pass
// takes the partition into the new group), "clean" (the survivor is killed at the
// takeover and started again) or "writeFails" (so, but started first with its first
// segment write failing: the opening that applies the replaced group's log fails, and
// the node stops rather than start the new group without it).
func forcedTakeoverKeepsTheSurvivorsLog(t *testing.T, restart string) {
	tags, env := "chaosnet", []string(nil)
	if restart != "none" {
		// Every node could be the survivor; only the survivor reaches the point.
		tags, env = "chaosnet,failpoints", []string{failpoint.EnvVar + "=" + failpoint.ReplicaTakeover + ":kill@1"}
	}
	nodes, files := startChaosClusterWith(t, 5, tags, env, "--auto-rebalance=false")
	atVersion(t, nodes[0], 3)
	nodes[0].api.createTopic("fl", map[string]any{"partitions": 1, "replication_factor": 3, "visibility_timeout_ms": 5000})
	lead := leaderOf(t, nodes, "fl", 0)
	reps := replicasOf(lead, "fl", 0)
	// Producers through the leader, without pause, while its followers are lost.
	var (
		mu       sync.Mutex
		accepted = map[string]bool{}
		unknown  = map[string]bool{}
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprint("w", w, "-", i)
				r, err := lead.api.Try(http.MethodPost, topicPath("fl")+"/produce", []byte(`{"id":"`+id+`"}`), "Content-Type", "application/json")
				mu.Lock()
				switch {
				case err == nil && r.Status == http.StatusAccepted:
					accepted[id] = true
				case err == nil && r.Status == http.StatusServiceUnavailable && strings.Contains(string(r.Body), `"timeout"`):
					unknown[id] = true
				}
				mu.Unlock()
				if err == nil && r.Status != http.StatusAccepted {
					return // the partition stopped accepting: this producer is done
				}
			}
		}()
	}
	waitFor(t, 30*time.Second, "some produces accepted", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted) >= 50
	})
	var lost []*clusterNode
	for _, id := range reps {
		if nd := nodeByID(nodes, id); nd != lead {
			lost = append(lost, nd)
		}
	}
	cut, killed := lost[0], lost[1]
	cutNode(t, cut, files[indexOf(nodes, cut)], true)
	killed.Kill()
	wipe(t, killed.DataDir())
	close(stop)
	wg.Wait()
	mu.Lock()
	if len(unknown) == 0 {
		mu.Unlock()
		t.Fatalf("no produce was in flight when the followers were lost (%d accepted)", len(accepted))
	}
	mu.Unlock()
	var asker *clusterNode
	for _, nd := range nodes {
		if !slices.Contains(reps, nd.id) {
			asker = nd
		}
	}
	if restart != "none" {
		// The survivor dies at its takeover, before it applies anything of it; the
		// request waits for it to lead, and is asked again (it is idempotent) once it
		// runs again.
		first := make(chan struct{})
		go func() {
			defer close(first)
			_, _ = asker.api.Try(http.MethodPost, topicPath("fl")+"/partitions/0/force-leader", []byte(`{"node":"`+lead.id+`"}`), "Content-Type", "application/json")
		}()
		defer func() {
			select {
			case <-first:
			case <-time.After(60 * time.Second):
				t.Error("the first force-leader request did not return")
			}
		}()
		if _, ok := lead.Wait(60 * time.Second); !ok || !strings.Contains(lead.Log(), failpoint.FiredPrefix+" name="+failpoint.ReplicaTakeover) {
			t.Fatalf("the survivor did not die at its takeover's failpoint (exited: %v)", ok)
		}
		if restart == "writeFails" {
			// The write fails: the node must not start the new group without the
			// log's tail. It stops; started again (by its supervisor), it reads the
			// log again.
			o := lead.Options()
			o.Env = slices.DeleteFunc(o.Env, func(e string) bool { return strings.HasPrefix(e, failpoint.EnvVar+"=") })
			failing := o
			failing.Env = append(slices.Clone(o.Env), failpoint.EnvVar+"="+failpoint.SegmentAfterWrite+":eio@1")
			lead.Relaunch(failing)
			if _, ok := lead.Wait(60 * time.Second); !ok {
				t.Fatal("the survivor whose write failed while it applied the replaced group's log kept running")
			}
			if log := lead.Log(); !strings.Contains(log, failpoint.FiredPrefix+" name="+failpoint.SegmentAfterWrite) ||
				!strings.Contains(log, "failed a write while applying its replaced group's log") {
				t.Fatal("the survivor stopped, but not for a failed write applying the replaced group's log")
			}
			lead.Relaunch(o)
		} else {
			lead.Launch()
		}
		if err := lead.WaitReady(); err != nil {
			t.Fatal(err)
		}
	}
	forceLeader(t, asker, "fl", lead)
	seen := map[string]int{}
	drain(t, asker, "fl", seen, 3*time.Second)
	for id := range accepted {
		if seen[id] == 0 {
			t.Errorf("%s, answered 202 before the takeover, never delivered", id)
		}
	}
	kept := 0
	for id := range unknown {
		if seen[id] > 0 {
			kept++
		}
	}
	if kept == 0 {
		t.Errorf("none of the %d produces in flight at the kill (in the survivor's log, never committed) was delivered after the takeover", len(unknown))
	}
	t.Logf("%d accepted, %d with an unknown outcome, %d of those delivered after the takeover", len(accepted), len(unknown), kept)
	// The cut-off follower comes back once the set grew back on the other nodes: no
	// longer placed there, its replica closes (its data kept) and it leaves the
	// replaced group, the only one it held.
	waitGrownBack(t, asker, "fl")
	if got := replicasOf(asker, "fl", 0); slices.Contains(got, cut.id) {
		t.Fatalf("replicas %v include the cut-off node", got)
	}
	cutNode(t, cut, files[indexOf(nodes, cut)], false)
	waitFor(t, 60*time.Second, "the returning follower to close its replica", func() bool {
		return strings.Contains(cut.Log(), "closed a replica no longer placed here")
	})
	waitFor(t, 10*time.Second, "the returning follower to hold no Raft group", func() bool {
		q, ok1 := metricValue(cut.api, `narad_replication_groups{state="quiesced"}`)
		a, ok2 := metricValue(cut.api, `narad_replication_groups{state="active"}`)
		return ok1 && ok2 && q+a == 0
	})
}

// waitGrownBack waits until partition 0 of topic has three replicas again, as asker
// sees it, and no move is under way.
func waitGrownBack(t *testing.T, asker *clusterNode, topic string) {
	t.Helper()
	waitFor(t, 90*time.Second, "three replicas again, no move under way", func() bool {
		for _, m := range moves(asker) {
			if m.Status == "copying" || m.Status == "switching" || m.Status == "removing" {
				return false
			}
		}
		return len(replicasOf(asker, topic, 0)) == 3
	})
}

// forceLeader asks through asker for a forced takeover of partition 0 of topic by
// survivor, and returns the 200 answer. The control plane may have lost voters too: a
// 503 while it elects a new controller is retried, as a client would (the takeover is
// idempotent).
func forceLeader(t *testing.T, asker *clusterNode, topic string, survivor *clusterNode) *testutil.Response {
	t.Helper()
	var r *testutil.Response
	waitFor(t, 60*time.Second, "the forced takeover to answer", func() bool {
		var err error
		r, err = asker.api.Try(http.MethodPost, topicPath(topic)+"/partitions/0/force-leader", []byte(`{"node":"`+survivor.id+`"}`), "Content-Type", "application/json")
		return err == nil && r.Status != http.StatusServiceUnavailable
	})
	if r.Status != http.StatusOK {
		t.Fatalf("force-leader: %d %s", r.Status, r.Body)
	}
	return r
}
