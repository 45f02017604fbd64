package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
		quiet: 7 * time.Second, crashes: true}
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
	var last moveJSON
	waitFor(c.t, bound, "move "+id+" to be done", func() bool {
		for _, nd := range c.nodes {
			if !c.usable(nd) {
				continue
			}
			for _, mv := range moves(nd) {
				if mv.ID == id {
					last = mv
					if mv.Status == "failed" || mv.Status == "cancelled" {
						c.t.Fatalf("move %s ended %s: %s", id, mv.Status, mv.Reason)
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
	c.load()
	c.progress(20)

	// 1. Move partition 0's replica off its leader.
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

// TestClusterMoveSurvivesAKill: a move whose one party (chosen by the seed: the
// controller, the partition's leader, the replica moving off, or the one it moves
// to) is killed with SIGKILL while the move is under way, and started again, still
// ends done, and under load nothing is lost or delivered again after its ack. The
// seed (NARAD_MOVE_SEED to repeat one) picks the party and whether it dies while
// copying or at the switch; make chaos-cluster runs every combination.
func TestClusterMoveSurvivesAKill(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("NARAD_MOVE_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("NARAD_MOVE_SEED=%q: %v", s, err)
		}
		seed = n
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	parties := []string{"controller", "leader", "source", "target"}
	party := parties[rng.IntN(len(parties))]
	phase := []string{"copying", "switching"}[rng.IntN(2)]
	if e := os.Getenv("NARAD_MOVE_PARTY"); e != "" {
		party = e
	}
	if e := os.Getenv("NARAD_MOVE_PHASE"); e != "" {
		phase = e
	}
	t.Logf("seed %d (NARAD_MOVE_SEED): kill the %s while the move is %s", seed, party, phase)
	moveKill(t, party, phase)
}

// moveKill runs one move on four nodes under load and kills party when the move is
// first seen at phase (or later).
func moveKill(t *testing.T, party, phase string) {
	c := startMovesCluster(t, 4)
	c.load()
	c.progress(50)
	lead := leaderOf(t, c.nodes, c.topic, 1)
	reps := replicasOf(lead, c.topic, 1)
	var source, target *clusterNode
	for _, nd := range c.nodes {
		switch {
		case !slices.Contains(reps, nd.id):
			target = nd
		case nd != lead && source == nil:
			source = nd
		}
	}
	victim := map[string]*clusterNode{"controller": controllerOf(t, c.nodes...), "leader": lead, "source": source, "target": target}[party]
	mv := startMove(t, c.nodes[0], c.topic, 1, source.id, target.id)
	if phase == "switching" {
		waitFor(t, 60*time.Second, "the move to switch", func() bool {
			for _, m := range moves(c.nodes[0]) {
				if m.ID == mv.ID {
					return m.Status != "copying"
				}
			}
			return false
		})
	}
	c.mu.Lock()
	c.stopping[victim.id] = true
	c.mu.Unlock()
	victim.Kill()
	t.Logf("killed %s (the %s)", victim.id, party)
	victim.RestartAfterKill()
	if err := victim.WaitReady(); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	delete(c.stopping, victim.id)
	c.mu.Unlock()
	c.moveEnds(mv.ID, 120*time.Second)
	waitFor(t, 60*time.Second, "the moved-off replica's data to be deleted", func() bool { return partitionDir(source, c.topic, 1) == "" })
	want := slices.DeleteFunc(slices.Clone(reps), func(r string) bool { return r == source.id })
	want = append(want, target.id)
	slices.Sort(want)
	if got := replicasOf(c.nodes[0], c.topic, 1); !slices.Equal(got, want) {
		t.Fatalf("replicas after the move: %v, want %v", got, want)
	}
	c.progress(20)
	c.finish()
}

// TestClusterReplicationFactorFromOne: a topic of one replica per partition (as a
// single-node data directory brings) is raised to three under load. Each partition
// becomes a group over the data it holds, its first snapshot standing for it; the new
// replicas restore that snapshot by fetching the messages, then follow the log. Then
// every node holds the same messages, a kill -9 of each partition's leader loses
// nothing, and nothing acked is delivered again.
func TestClusterReplicationFactorFromOne(t *testing.T) {
	t.Parallel()
	c := &upgradeCluster{t: t, topic: "single", accepted: map[string]bool{}, acked: map[string]bool{}, delivered: map[string]int{},
		answers: map[string]int{}, stopping: map[string]bool{}, stop: make(chan struct{}), quiet: 7 * time.Second, crashes: true}
	var peers []string
	for i := range 3 {
		nd := &clusterNode{id: fmt.Sprintf("n%d", i+1), addr: freeClusterAddr(t)}
		c.nodes = append(c.nodes, nd)
		peers = append(peers, nd.id+"@"+nd.addr)
	}
	c.peers = strings.Join(peers, ",")
	rel := release{name: "this binary", args: []string{"--auto-rebalance=false"}}
	var opts []testutil.Options
	for _, nd := range c.nodes {
		opts = append(opts, c.options(nd, rel))
	}
	for i, p := range testutil.StartNarads(t, opts...) {
		c.nodes[i].Narad = p
		c.nodes[i].api = &api{Client: p.Client(), t: t}
	}
	atVersion(t, c.nodes[0], 3)
	c.nodes[0].api.createTopic(c.topic, map[string]any{"partitions": 3, "replication_factor": 1, "visibility_timeout_ms": 5000})
	c.load()
	c.progress(100)

	r := c.nodes[1].api.Do(http.MethodPatch, topicPath(c.topic), []byte(`{"replication_factor":3}`), "Content-Type", "application/json")
	if r.Status != http.StatusOK {
		t.Fatalf("PATCH replication_factor 3: %d %s", r.Status, r.Body)
	}
	waitFor(t, 120*time.Second, "every partition at 3 replicas, no move under way", func() bool {
		for p := range 3 {
			if len(replicasOf(c.nodes[0], c.topic, p)) != 3 {
				return false
			}
		}
		for _, mv := range moves(c.nodes[0]) {
			if mv.Status != "done" {
				if mv.Status == "failed" || mv.Status == "cancelled" {
					t.Fatalf("move %s ended %s: %s", mv.ID, mv.Status, mv.Reason)
				}
				return false
			}
		}
		return true
	})
	c.progress(50)
	// Each partition's leader dies: the partition now lives on in its replicas.
	for p := range 3 {
		lead := leaderOf(t, c.nodes, c.topic, p)
		c.mu.Lock()
		c.stopping[lead.id] = true
		c.mu.Unlock()
		lead.Kill()
		lead.RestartAfterKill()
		if err := lead.WaitReady(); err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		delete(c.stopping, lead.id)
		c.mu.Unlock()
		c.progress(20)
	}
	c.finish()
	// The new replicas hold the messages from before the raise too: the segment
	// files are byte-equal on every node.
	inc := c.nodes[0].api.topic(c.topic).Incarnation
	for _, nd := range c.nodes {
		nd.Stop()
	}
	for p := range 3 {
		samePartitionLogs(t, c.nodes, inc+"-"+c.topic, p)
	}
}

// TestClusterForcedTakeover: on five nodes (the control plane keeps its majority),
// two of a partition's three replicas are killed and their disks lost, so the
// partition can never elect a leader again. A forced takeover makes the survivor lead
// what it holds and reports a lower bound of the loss; then every message produced
// after it is delivered, nothing acked before it is delivered again, the replica set
// grows back to three on live nodes, and a lost replica's node that comes back with
// its old data is not let into the new group (its copy is not served).
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

	// The control plane lost two of its five voters too: a 503 while it elects a new
	// controller is retried, as a client would (the takeover is idempotent).
	var r *testutil.Response
	waitFor(t, 60*time.Second, "the forced takeover to answer", func() bool {
		var err error
		r, err = asker.api.Try(http.MethodPost, topicPath("ft")+"/partitions/0/force-leader", []byte(`{"node":"`+survivor.id+`"}`), "Content-Type", "application/json")
		return err == nil && r.Status != http.StatusServiceUnavailable
	})
	if r.Status != http.StatusOK {
		t.Fatalf("force-leader: %d %s", r.Status, r.Body)
	}
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
	// The set grows back to the replication factor on the live nodes.
	waitFor(t, 90*time.Second, "three replicas again", func() bool { return len(replicasOf(asker, "ft", 0)) == 3 })
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
	seen := map[string]int{}
	drain(t, asker, "ft", seen, 7*time.Second)
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

// TestClusterJoinRebalanceAndReplace: a fourth node joins a 3-node cluster whose
// controller rebalances on its own: replicas move onto it until no two nodes hold more
// than one apart, while leased messages stay leased (their receipt handles ack with
// 204 afterwards: a quiet rebalance redelivers nothing). Then that node is killed for
// good and decommissioned: its replicas are copied again from the survivors (cause
// replace) and it leaves the members; every message is delivered once.
func TestClusterJoinRebalanceAndReplace(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 3)
	atVersion(t, nodes[0], 3)
	nodes[0].api.createTopic("rb", map[string]any{"partitions": 3, "replication_factor": 3, "visibility_timeout_ms": 120000})
	for p := range 3 {
		leaderOf(t, nodes, "rb", p)
	}
	for i := range 300 {
		if s := produceTry(nodes[i%3], "rb", fmt.Sprint("m", i)); s != http.StatusAccepted {
			t.Fatalf("produce %d: %d", i, s)
		}
	}
	var leased []message
	for len(leased) < 30 {
		leased = append(leased, nodes[0].api.consumeBatch("rb", 30-len(leased), "1s")...)
	}
	n4 := startJoiner(t, "n4", nodes[0].addr, "")
	all := append(slices.Clone(nodes), n4)
	waitFor(t, 120*time.Second, "the controller to spread the replicas onto n4", func() bool {
		held := map[string]int{}
		for p := range 3 {
			for _, r := range replicasOf(nodes[0], "rb", p) {
				held[r]++
			}
		}
		for _, mv := range moves(nodes[0]) {
			if mv.Status != "done" {
				return false
			}
		}
		return held["n4"] >= 2 && len(held) == 4
	})
	var rebalanced int
	for _, mv := range moves(nodes[0]) {
		if mv.Cause != "rebalance" || mv.To != "n4" {
			t.Fatalf("a move other than a rebalance onto n4: %+v", mv)
		}
		rebalanced++
	}
	// Every lease taken before survives the moves and their leadership changes.
	for _, m := range leased {
		if r := nodes[1].api.ack("rb", m.ReceiptHandle, ""); r.Status != http.StatusNoContent {
			t.Fatalf("ack of %s leased before the rebalance: %d %s", m.where(), r.Status, r.Body)
		}
	}

	n4.Kill()
	waitFor(t, 60*time.Second, "n4 to be seen as down", func() bool {
		c, err := nodes[0].cluster()
		if err != nil {
			return false
		}
		for _, m := range c.Members {
			if m.ID == "n4" {
				return m.Status == "suspect" || m.Status == "dead"
			}
		}
		return false
	})
	r := nodes[0].api.Do(http.MethodDelete, "/v1/cluster/members/n4", nil)
	if r.Status != http.StatusAccepted {
		t.Fatalf("DELETE /v1/cluster/members/n4: %d %s", r.Status, r.Body)
	}
	waitFor(t, 120*time.Second, "n4 to be replaced and leave the members", func() bool {
		return !strings.Contains(membersOf(t, nodes[0]), "n4@")
	})
	replaced := 0
	for _, mv := range moves(nodes[0]) {
		if mv.From == "n4" && mv.Cause == "replace" && mv.Status == "done" {
			replaced++
		}
	}
	if replaced == 0 {
		t.Fatalf("no replace move off n4: %+v", moves(nodes[0]))
	}
	for p := range 3 {
		if got := replicasOf(nodes[0], "rb", p); len(got) != 3 || slices.Contains(got, "n4") {
			t.Fatalf("partition %d's replicas after n4 left: %v", p, got)
		}
	}
	seen := map[string]int{}
	drain(t, nodes[2], "rb", seen, 3*time.Second)
	acked := map[string]bool{}
	for _, m := range leased {
		acked[payloadID(t, &m)] = true
	}
	for i := range 300 {
		id := fmt.Sprint("m", i)
		switch {
		case acked[id] && seen[id] > 0:
			t.Errorf("%s, acked after the rebalance, delivered again", id)
		case !acked[id] && seen[id] != 1:
			t.Errorf("%s delivered %d times, want once", id, seen[id])
		}
	}
	t.Logf("%d rebalance moves onto n4, %d replace moves off it; %d nodes", rebalanced, replaced, len(all))
}
