package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReplicationFanoutCopiesADamagedLeaderRecordFromAnIntactReplica: a fan-out copy
// that meets a damaged record on the leader of a replicated parent partition must not
// skip it for good (the single-node rule): the other replicas hold it intact. The
// leader's replica is marked for a rebuild like one that meets it at lease time, hands
// its leadership over, and the next leader copies the message from its own copy. On
// the old code the copier skipped it and committed its cursor past it in the group:
// the child never got it.
func TestReplicationFanoutCopiesADamagedLeaderRecordFromAnIntactReplica(t *testing.T) {
	t.Parallel()
	nodes := startPeersCluster(t, 3)
	atVersion(t, nodes[0], 2)
	nodes[0].api.createTopic("dsrc", map[string]any{"partitions": 1})
	nodes[0].api.createTopic("ddst", map[string]any{"partitions": 1})
	// Copies wait 8 s: time to damage the leader's copy of a message first.
	nodes[0].api.PostJSON("/v1/topics/dsrc/children", map[string]any{"child": "ddst", "fanout_delay_ms": 8000}).Expect(t, http.StatusCreated)
	lead := leaderOf(t, nodes, "dsrc", 0)
	for i := range 10 {
		if s := produceTry(lead, "dsrc", fmt.Sprintf("d%02d", i)); s != http.StatusAccepted {
			t.Fatalf("produce d%02d: %d", i, s)
		}
	}
	waitFor(t, 30*time.Second, "every replica to hold the 10 messages", func() bool { return followerHasAll(t, nodes, "dsrc", 10) })
	flipInPlace(t, filepath.Join(partitionDir(lead, "dsrc", 0), "log"), `"d03"`)
	// More messages after the damage, for the copy to go on with.
	for i := 10; i < 20; i++ {
		waitFor(t, 30*time.Second, "a produce accepted", func() bool { return produceTry(nodes[0], "dsrc", fmt.Sprintf("d%02d", i)) == http.StatusAccepted })
	}
	childEnd := func() int64 {
		for _, nd := range nodes {
			r, err := nd.api.Try(http.MethodGet, topicPath("ddst"), nil)
			if err != nil || r.Status != http.StatusOK {
				continue
			}
			var d struct {
				PartitionStats []struct {
					NextOffset int64 `json:"next_offset"`
				} `json:"partition_stats"`
			}
			if json.Unmarshal(r.Body, &d) == nil && len(d.PartitionStats) == 1 {
				return d.PartitionStats[0].NextOffset
			}
		}
		return -1
	}
	deadline := time.Now().Add(90 * time.Second)
	for childEnd() < 20 {
		if time.Now().After(deadline) {
			var lines []string
			for _, l := range strings.Split(lead.Log(), "\n") {
				if strings.Contains(l, "fan-out") || strings.Contains(l, "damaged") {
					lines = append(lines, l)
				}
			}
			t.Fatalf("the child holds %d copies after 90 s, want 20 (the damaged one copied from an intact replica); the leader's log:\n%s", childEnd(), strings.Join(lines, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	seen := map[string]int{}
	drain(t, nodes[0], "ddst", seen, 3*time.Second)
	for i := range 20 {
		if seen[fmt.Sprintf("d%02d", i)] == 0 {
			t.Errorf("d%02d never reached the child", i)
		}
	}
}
