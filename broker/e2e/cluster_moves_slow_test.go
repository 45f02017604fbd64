//go:build cluster

package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/narad-mq/narad/broker/internal/testutil"
)

// The slower membership tests: make chaos-cluster and make e2e run them.

// TestClusterForcedTakeoverWriteFails: a forced takeover's survivor, killed at the
// takeover, starts again with its first segment write failing, which is the first
// write of the replaced group's log it applies. It must not start the new group
// without that log: it stops, and once started again it applies the log, so every
// 202'd message and the produces in flight at the loss are delivered (see
// TestClusterForcedTakeoverKeepsTheSurvivorsLog; the placement pass that takes a
// running survivor into the new group opens the partition through the same code, and
// tries the opening again at its next pass instead of stopping).
func TestClusterForcedTakeoverWriteFails(t *testing.T) {
	t.Parallel()
	forcedTakeoverKeepsTheSurvivorsLog(t, "writeFails")
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

// TestClusterJoinRebalanceAndReplace: a fourth node joins a 3-node cluster whose
// controller rebalances on its own: replicas move onto it until no two nodes hold more
// than one apart, then leaderships (n4 comes to lead partitions), while leased
// messages stay leased (their receipt handles ack with
// 204 afterwards: a quiet rebalance redelivers nothing). Then that node is killed for
// good and decommissioned: its replicas are copied again from the survivors (cause
// replace) and it leaves the members; every message is delivered once.
func TestClusterJoinRebalanceAndReplace(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 3)
	atVersion(t, nodes[0], 3)
	nodes[0].api.createTopic("rb", map[string]any{"partitions": 6, "replication_factor": 3, "visibility_timeout_ms": 120000})
	for p := range 6 {
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
		for p := range 6 {
			for _, r := range replicasOf(nodes[0], "rb", p) {
				held[r]++
			}
		}
		for _, mv := range moves(nodes[0]) {
			if mv.Status != "done" {
				return false
			}
		}
		return held["n4"] >= 4 && len(held) == 4
	})
	// Leaderships follow: n4 comes to lead partitions too (handed over, leases and all).
	waitFor(t, 60*time.Second, "n4 to lead a partition", func() bool {
		for p := range 6 {
			if l := newLeader(t, all, "rb", p, nil); l == n4 {
				return true
			}
		}
		return false
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
	for p := range 6 {
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
